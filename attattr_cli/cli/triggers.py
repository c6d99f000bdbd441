"""`attattr triggers`: adversarial triggers from attention attribution (docs/method.md section 4.1)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import FLAGS, command_line, edge, err, out, progress_bar, renamed_options, store_notes

RANKINGS_HELP = "count (ties: total strength), total (count x mean), or mean strength"


def triggers(
    store: Optional[Path] = typer.Argument(None, help="An attattr store to read (default: score on the fly, see --model/--data)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Triggers file: JSON, or CSV when it ends in .csv."),
    top_k: Optional[int] = typer.Option(None, "--top-k", "-k", help="Keep the K best triggers (of each class with --per-class); default all."),
    top_old: Optional[int] = options.hidden("--top"),
    per_class: bool = typer.Option(False, "--per-class", help="Rank within each class the triggers push towards."),
    rank_by: str = typer.Option("count", "--rank", help="Rank by " + RANKINGS_HELP + "."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Also write the triggers as CSV here."),
    special: bool = typer.Option(False, "--special/--words", help="--special: every entry counts, also those touching [CLS]/[SEP] (the 2021 code); default --words: entries between two real tokens."),
    aggregate: Optional[str] = typer.Option(None, "--aggregate", help="words: triggers are words (each example's maps merged into words, entries summed over their pieces, before the top entries are taken); tokens (default): as scored."),
    min_tokens: int = typer.Option(0, "--min-tokens", help="Skip examples with fewer tokens, special tokens included (the 2021 code: 15 for SST-2)."),
    limit: Optional[int] = typer.Option(None, "--limit", help="On the fly: score only the first N selected examples that pass --min-tokens."),
    model: Optional[str] = options.model("Score on the fly with this model (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = options.data("Score on the fly on this TSV, CSV or JSONL (default: the built-in synthetic set)."),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples("Indices and ranges to score, e.g. 0:500 (default: all)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="On the fly: the right rule with this many steps instead of --tol (20 is the paper's)."),
    tol: Optional[float] = typer.Option(None, "--tol", help="On the fly: error-controlled integration to this tolerance (the default, 0.1, without --steps; see `attattr score --help`)."),
    keep_store: Optional[Path] = typer.Option(None, "--store", help="On the fly: score into this store (kept, and resumed if it exists) instead of a temporary one."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    as_json: bool = options.as_json(),
    quiet: bool = options.quiet(),
) -> None:
    """Extract adversarial triggers from attention attribution (Hao et al. 2021, section 4).

    Per example the head with the largest attribution entry, and its top-2 entries (query,
    key) as token patterns with their positions relative to their segment; the same pattern
    is aggregated across examples (count, strength, the classes it pushes towards) and ranked.
    Reads a store, or scores on the fly (--model/--data, or the built-in default with neither).
    Prints the triggers file's path on stdout (--json: the triggers).
    """
    with edge():
        from ..api import triggers as run
        top = options.pick(top_k, top_old)
        with progress_bar("triggers", quiet) as bar, renamed_options(*FLAGS, "aggregate"):
            res = run(store, model=model, data=data, task=task, examples=examples, steps=steps, tol=tol, top_k=top,
                      per_class=per_class, rank_by=rank_by, special=special, min_tokens=min_tokens, limit=limit,
                      store=keep_store, device=device, out=out_path, progress=bar, command=command_line(),
                      aggregate=aggregate, threads=threads)
        if csv_path is not None:
            res.save_csv(csv_path)
        doc, chosen = res.document, res.triggers
        source = doc.get("source") or {}
        store_notes(source.get("skipped_nonfinite"), source.get("unconverged"), source.get("used", 0))
        if not quiet:
            err.print(
                f"{doc['examples']} examples, {len(res.patterns)} patterns, {res.distinct} distinct triggers; "
                f"{len(chosen)} written to {out_path}",
                markup=False,
            )
            if not as_json:
                for t in chosen[:10]:
                    err.print(
                        f"  #{t.rank:<3} {' '.join(t.tokens):<28} -> {t.label:<14} count {t.count:<4} "
                        f"mean {t.mean_strength:.4f}  segments {','.join(map(str, t.segments))}",
                        markup=False,
                    )
        if as_json:
            options.print_rows([t.to_json() for t in chosen], "json")
        else:
            out.print(str(out_path), markup=False)
