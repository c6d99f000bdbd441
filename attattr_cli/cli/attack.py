"""`attattr attack`: insert triggers into examples and report accuracy per class (Table 2)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from .common import TASK_HELP, edge, err, out, progress_bar
from ..fileio import write_atomic


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def attack(
    triggers_path: Path = typer.Option(..., "--triggers", "-T", help="Triggers JSON from `attattr triggers`."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Result JSON (default: stdout)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local model folder or hub id (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="TSV, CSV or JSONL to attack (default: the built-in synthetic held-out set); only read."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help=TASK_HELP),
    examples: Optional[str] = typer.Option(None, "--examples", "-e", help="Indices and ranges to attack, e.g. 0:500 (default: all)."),
    top: int = typer.Option(3, "--top", "-k", help="Use the K best triggers (of each class if the file was made with --per-class)."),
    controls: Optional[int] = typer.Option(None, "--controls", help="Random-token controls, each mirroring a trigger's layout (default: one per trigger)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the controls' tokens."),
    position: str = typer.Option("relative", "--position", help="Where tokens go in their segment: relative (default), reference (the 2021 formula), start, end, or a number in [0, 1]."),
    save_texts: Optional[Path] = typer.Option(None, "--save-texts", help="Write every attacked example as JSON lines here."),
    batch_size: int = typer.Option(64, "--batch-size", help="Examples per forward pass."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table."),
) -> None:
    """Insert triggers into every example at their relative position in their segment, classify
    again, and report per gold class the accuracy before and after (the paper's Table 2),
    beside random-token controls of the same size inserted the same way.

    The table goes to stderr, the JSON to --out (or stdout). The data file is only read.
    """
    from ..analysis.attack import from_document, run_attack
    from ..analysis.triggers import load_triggers

    with edge():
        from ..data import parse_examples
        from ..engine.run import resolve_inputs
        from ..errors import OptionError
        from ..models.default import DEFAULT_MODEL_DIR, DEFAULT_MODEL_ID
        from ..models.loading import load

        if batch_size < 1:
            raise OptionError(f"--batch-size must be at least 1, got {batch_size}")
        doc = load_triggers(triggers_path)
        chosen = from_document(doc, top)
        model_id, task_obj, rows, labels = resolve_inputs(model, data, task)
        picked = [rows[i] for i in parse_examples(examples, len(rows))]
        loaded = load(model_id, device=device)
        if Path(model_id).resolve() == DEFAULT_MODEL_DIR.resolve():
            loaded.model_id = DEFAULT_MODEL_ID
        with progress_bar("attack", quiet) as bar:
            result = run_attack(loaded, picked, labels, chosen, controls=controls, seed=seed, position=position,
                                batch_size=batch_size, keep_texts=save_texts is not None, progress=bar)
        result["data"] = data or "builtin"
        result["task"] = task_obj.name if task_obj else ""
        result["triggers_file"] = str(triggers_path)
        texts = result.pop("texts", None)
        if save_texts is not None:
            write_atomic(save_texts, "".join(json.dumps(t, ensure_ascii=False) + "\n" for t in texts or []))
        text = json.dumps(result, indent=2, ensure_ascii=False) + "\n"
        if out_path is None or str(out_path) == "-":
            out.file.write(text)
        else:
            write_atomic(out_path, text)
        if not quiet:
            _print_table(result)
            if out_path is not None and str(out_path) != "-":
                out.print(str(out_path), markup=False)


def _print_table(result: dict) -> None:
    cols = max((len(r["triggers"]) for r in result["table"]), default=0)
    t = Table(title=f"accuracy (%) per gold class with triggers of the other classes ({result['examples']} examples)")
    t.add_column("class", no_wrap=True)
    t.add_column("n", justify="right")
    t.add_column("before", justify="right")
    for k in range(cols):
        t.add_column(f"trigger {k + 1}", justify="right")
    t.add_column("mean", justify="right")
    t.add_column("control", justify="right")
    for row in result["table"]:
        cells = [f"{_pct(x['accuracy'])} {x['name']}" for x in row["triggers"]]
        cells += [""] * (cols - len(cells))
        t.add_row(row["class"], str(row["n"]), _pct(row["before"]), *cells,
                  _pct(row["trigger_mean"]), _pct(row["control_mean"]))
    err.print(t)
    lines = []
    for r in result["triggers"] + result["controls"]:
        who = f"-> {r['class']}" if r["kind"] == "trigger" else f"mirrors {r['mirrors']}"
        accs = ", ".join(f"{c} {_pct(a)}" for c, a in r["accuracy"].items())
        lines.append(f"  {r['name']:<4} {' '.join(r['tokens']):<28} {who:<18} {accs}; flipped {r['flipped']}, truncated {r['truncated']}")
    err.print("\n".join(lines), markup=False)
