"""`attattr triggers`: adversarial triggers from attention attribution (METHOD.md section 4)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Optional

import typer

from ..analysis.triggers import RANKINGS, aggregate, patterns_from_store, select, triggers_csv, triggers_document
from ..errors import OptionError
from ..fileio import write_atomic
from ..store import Store
from .common import TASK_HELP, command_line, edge, err, out, progress_bar



def _select_by_length(model, data, task, examples, min_tokens, limit, device, dtype):
    """Load the model, and the indices (as a --examples spec) of the selected examples that
    have at least ``min_tokens`` tokens, the first ``limit`` of them."""
    from ..data import parse_examples
    from ..engine.run import resolve_inputs
    from ..models.loading import load

    model_id, _task, rows, _labels = resolve_inputs(model, data, task)
    chosen = parse_examples(examples, len(rows))
    loaded = load(model_id, device=device, dtype=dtype)
    if min_tokens > 0 or limit is not None:
        tok = loaded.tokenizer
        keep = []
        for i in chosen:
            e = rows[i]
            args = (e.text_a,) if e.text_b is None else (e.text_a, e.text_b)
            if len(tok(*args, add_special_tokens=True)["input_ids"]) >= min_tokens:
                keep.append(i)
                if limit is not None and len(keep) >= limit:
                    break
        if not keep:
            raise OptionError(f"no selected example has at least {min_tokens} tokens")
        chosen = keep
    return loaded, ",".join(map(str, chosen)), len(chosen)


def triggers(
    store: Optional[Path] = typer.Argument(None, help="An attattr store to read (default: score on the fly, see --model/--data)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Triggers file: JSON, or CSV when it ends in .csv."),
    top: Optional[int] = typer.Option(None, "--top", "-k", help="Keep the K best triggers (of each class with --per-class); default all."),
    per_class: bool = typer.Option(False, "--per-class", help="Rank within each class the triggers push towards."),
    rank_by: str = typer.Option("count", "--rank", help="Rank by count (ties: total strength), total strength (count x mean), or mean strength: " + ", ".join(RANKINGS) + "."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Also write the triggers as CSV here."),
    special: bool = typer.Option(False, "--special/--words", help="--special: every entry counts, also those touching [CLS]/[SEP] (the 2021 code); default --words: entries between two real tokens."),
    min_tokens: int = typer.Option(0, "--min-tokens", help="Skip examples with fewer tokens, special tokens included (the 2021 code: 15 for SST-2)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="On the fly: score only the first N selected examples that pass --min-tokens."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Score on the fly with this model (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Score on the fly on this TSV, CSV or JSONL (default: the built-in synthetic set)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help=TASK_HELP),
    examples: Optional[str] = typer.Option(None, "--examples", "-e", help="Indices and ranges to score, e.g. 0:500 (default: all)."),
    steps: int = typer.Option(20, "--steps", help="Integration steps when scoring on the fly."),
    keep_store: Optional[Path] = typer.Option(None, "--store", help="On the fly: score into this store (kept, and resumed if it exists) instead of a temporary one."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N (scoring on the fly)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary."),
) -> None:
    """Extract adversarial triggers from attention attribution (Hao et al. 2021, section 4).

    Per example the head with the largest attribution entry, and its top-2 entries (query,
    key) as token patterns with their positions relative to their segment; the same pattern
    is aggregated across examples (count, strength, the classes it pushes towards) and ranked.
    Reads a store, or scores on the fly (--model/--data, or the built-in default with neither).
    """
    with edge():
        if rank_by not in RANKINGS:
            raise OptionError(f"unknown --rank '{rank_by}'; available: {', '.join(RANKINGS)}")
        if top is not None and top < 1:
            raise OptionError(f"--top must be at least 1, got {top}")
        on_the_fly = store is None
        if not on_the_fly and (model or data or task or examples or keep_store or limit):
            raise OptionError("give either a STORE or --model/--data/--task/--examples to score on the fly, not both")
        tmpdir = None
        wanted = None
        try:
            if on_the_fly:
                from ..engine.run import ScoreRequest, score_to_store
                from ..engine.options import ScoreOptions

                loaded, spec, n = _select_by_length(model, data, task, examples, min_tokens, limit, device, "float32")
                wanted = [int(x) for x in spec.split(",")]
                if keep_store is not None:
                    store = keep_store
                else:
                    tmpdir = tempfile.TemporaryDirectory(prefix="attattr-triggers-")
                    store = Path(tmpdir.name) / "scores.h5"
                req = ScoreRequest(out=str(store), model=model, data=data, task=task, examples=spec,
                                   options=ScoreOptions(steps=steps), device=device, command=command_line())
                with progress_bar("score", quiet) as bar:
                    report = score_to_store(req, progress=bar, loaded=loaded)
                if not quiet:
                    acc = "" if report.accuracy is None else f" (accuracy {report.accuracy:.3f})"
                    err.print(f"scored {report.scored} examples{acc}, {report.skipped} already in {store}", markup=False)
            with Store(store) as s:
                prov = s.provenance
                labels = prov.get("label_names") or []
                with progress_bar("triggers", quiet) as bar:
                    patterns = patterns_from_store(s, progress=bar, min_tokens=min_tokens, special=special, indices=wanted)
            ranked = aggregate(patterns, labels, rank_by=rank_by)
            chosen = select(ranked, top, per_class, labels)
            source = {
                "store": None if tmpdir is not None else str(store),
                "model": prov.get("model"), "weights_sha256": prov.get("weights_sha256"),
                "task": prov.get("task"), "data": prov.get("data"),
                "options": prov.get("options"), "min_tokens": min_tokens, "special": special, "command": command_line(),
            }
            doc = triggers_document(chosen, label_names=labels, per_class=per_class, top=top, rank_by=rank_by,
                                    source=source, patterns=patterns)
        finally:
            if tmpdir is not None:
                tmpdir.cleanup()
        as_csv = out_path.suffix.lower() == ".csv"
        write_atomic(out_path, triggers_csv(chosen) if as_csv else json.dumps(doc, indent=2, ensure_ascii=False) + "\n")
        if csv_path is not None:
            write_atomic(csv_path, triggers_csv(chosen))
        if not quiet:
            err.print(
                f"{doc['examples']} examples, {len(patterns)} patterns, {len(ranked)} distinct triggers; "
                f"{len(chosen)} written to {out_path}",
                markup=False,
            )
            for t in chosen[:10]:
                err.print(
                    f"  #{t.rank:<3} {' '.join(t.tokens):<28} -> {t.label:<14} count {t.count:<4} "
                    f"mean {t.mean_strength:.4f}  segments {','.join(map(str, t.segments))}",
                    markup=False,
                )
        out.print(str(out_path), markup=False)
