"""`attattr attack`: insert triggers into examples and report accuracy per class (Table 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import options
from .common import FLAGS, edge, err, out, p_text, progress_bar, renamed_options, wide_err


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}"


def attack(
    triggers_path: Path = typer.Option(..., "--triggers", "-T", help="Triggers JSON from `attattr triggers`."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Result JSON (default: stdout)."),
    model: Optional[str] = options.model(),
    data: Optional[str] = options.data("TSV, CSV or JSONL to attack (default: the built-in synthetic held-out set); only read."),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples("Indices and ranges to attack, e.g. 0:500 (default: all)."),
    top_k: int = typer.Option(3, "--top-k", "-k", help="Use the K best triggers (of each class if the file was made with --per-class)."),
    top_old: Optional[int] = options.hidden("--top"),
    controls: Optional[int] = typer.Option(None, "--controls", help="Random-token controls per trigger layout (size and segments), each mirroring a trigger's positions (default: 20); the null distribution the triggers are tested against."),
    alpha: float = typer.Option(0.05, "--alpha", help="Level of the per-class verdict (Holm-adjusted over the classes)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the controls' tokens."),
    position: str = typer.Option("relative", "--position", help="Where tokens go in their segment: relative (default), reference (the 2021 formula), start, end, or a number in [0, 1]."),
    save_texts: Optional[Path] = typer.Option(None, "--save-texts", help="Write every attacked example as JSON lines here."),
    batch_size: int = typer.Option(64, "--batch-size", help="Examples per forward pass."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    as_json: bool = options.as_json(),
    as_csv: bool = options.as_csv(),
    quiet: bool = options.quiet(),
) -> None:
    """Insert triggers into every example at their relative position in their segment, classify
    again, and report per gold class the accuracy before and after (the paper's Table 2),
    beside random-token controls of the same size inserted the same way (20 per layout by
    default): per trigger its drop, percentile and exact permutation p-value among the
    controls; per class whether the triggers beat the controls at --alpha.

    The table goes to stderr, the JSON to --out (or stdout). --json/--csv: the table's rows on
    stdout. The data file is only read.
    """
    with edge():
        from ..api import attack as run

        top = options.pick(top_k, top_old, 3)
        to_file = out_path is not None and str(out_path) != "-"
        with progress_bar("attack", quiet) as bar, renamed_options(*FLAGS):
            res = run(model, triggers_path, data=data, task=task, examples=examples, top_k=top, controls=controls,
                      seed=seed, position=position, alpha=alpha, batch_size=batch_size, device=device,
                      out=out_path if to_file else None, save_texts=save_texts, progress=bar, threads=threads)
        result = res.document
        if as_json or as_csv:
            options.print_rows(_rows(result), "json" if as_json else "csv")
        elif not to_file:
            out.file.write(res.to_json() + "\n")
        if not quiet and not (as_json or as_csv):
            _print_table(result)
            if to_file:
                out.print(str(out_path), markup=False)


def _rows(result: dict) -> list[dict]:
    rows = []
    cols = max((len(r["triggers"]) for r in result["table"]), default=0)
    for row in result["table"]:
        d = {"class": row["class"], "n": row["n"], "before": row["before"]}
        for k in range(cols):
            x = row["triggers"][k] if k < len(row["triggers"]) else {}
            d[f"trigger_{k + 1}"] = x.get("name")
            d[f"trigger_{k + 1}_accuracy"] = x.get("accuracy")
        w = row.get("worst_control") or {}
        d.update(trigger_mean=row["trigger_mean"], control_mean=row["control_mean"], control_sd=row.get("control_sd"),
                 controls=row.get("control_count"), worst_control=" ".join(w.get("tokens", [])) or None,
                 worst_control_accuracy=w.get("accuracy"), p=row.get("p"), p_holm=row.get("p_holm"),
                 beats_controls=row.get("beats_controls"))
        rows.append(d)
    return rows


def _print_table(result: dict) -> None:
    cols = max((len(r["triggers"]) for r in result["table"]), default=0)
    t = Table(title=f"accuracy (%) per gold class with triggers of the other classes ({result['examples']} examples)")
    t.add_column("class", no_wrap=True)
    for col in ("n", "before", *(f"trigger {k + 1}" for k in range(cols)), "mean", "control", "control sd",
                "worst control", "p (Holm)"):
        t.add_column(col, justify="right")
    t.add_column(f"beats controls (α {result.get('alpha', 0.05):g})", justify="center")
    for row in result["table"]:
        cells = [f"{_pct(x['accuracy'])} {x['name']}" for x in row["triggers"]]
        cells += [""] * (cols - len(cells))
        w = row.get("worst_control")
        verdict = row.get("beats_controls")
        t.add_row(row["class"], str(row["n"]), _pct(row["before"]), *cells,
                  _pct(row["trigger_mean"]), f"{_pct(row['control_mean'])} (n {row['control_count']})",
                  _pct(row.get("control_sd")), f"{_pct(w['accuracy'])} {' '.join(w['tokens'])}" if w else "-",
                  p_text(row.get("p_holm")), "-" if verdict is None else ("yes" if verdict else "no"))
    wide_err().print(t)
    lines = []
    for r in result["triggers"]:
        accs = ", ".join(f"{c} {_pct(a)}" for c, a in r["accuracy"].items())
        c = r.get("controls") or {}
        stat = ""
        if r.get("drop") is not None and c.get("n"):
            stat = (f"; drop {_pct(r['drop'])} vs controls {_pct(c['drop_mean'])} ± {_pct(c['drop_sd'])} "
                    f"(max {_pct(c['drop_max'])}, n {c['n']}), percentile {r['percentile']:.0f}, p {p_text(r['p'])}")
        lines.append(f"  {r['name']:<4} {' '.join(r['tokens']):<28} {'-> ' + str(r['class']):<18} {accs}; "
                     f"flipped {r['flipped']}, truncated {r['truncated']}{stat}")
    ctrl = result["controls"]
    if ctrl:
        worst = sorted((r for r in ctrl if r.get("drop") is not None), key=lambda r: -r["drop"])[:3]
        lines.append(f"  {len(ctrl)} controls ({result.get('controls_per_layout')} per layout); the most damaging: "
                     + "; ".join(f"{r['name']} {' '.join(r['tokens'])} drop {_pct(r['drop'])}" for r in worst))
    if result.get("tests"):
        lines.append(f"  tests: {result['tests']}")
    err.print("\n".join(lines), markup=False)
