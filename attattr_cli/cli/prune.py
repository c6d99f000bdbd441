"""`attattr prune`: pruning curves, the effectiveness analysis, and really pruned models."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from . import options
from .common import (FLAGS, command_line, edge, err, out, p_text, parse_int_list, progress_bar, renamed_options,
                     store_notes, wide_err)


def prune(
    out_path: Path = typer.Option(..., "--out", "-o", help="CURVES.json to write (replaced only once complete)."),
    importance_path: Optional[Path] = typer.Option(None, "--importance", "-i", help="Importance file from attattr importance: one curve per method in it."),
    model: Optional[str] = options.model(),
    data: Optional[str] = options.data("Evaluation TSV, CSV or JSONL (default: the built-in synthetic held-out set)."),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples("Evaluation rows, e.g. 0:500 (default: all)."),
    rates: str = typer.Option("0:1:0.1", "--rates", help="Fractions of all heads to prune: start:stop:step (stop included) or a list."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Only these methods of the importance file (comma list; default: all)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Examples per forward pass."),
    keep_heads: Optional[float] = typer.Option(None, "--keep-heads", help="With --save-model: the fraction of heads to keep (the most important by --keep-method)."),
    keep_old: Optional[float] = options.hidden("--keep"),
    save_model: Optional[Path] = typer.Option(None, "--save-model", help="Write a really pruned model folder (BERT-family encoders)."),
    keep_method: Optional[str] = typer.Option(None, "--keep-method", help="Table that ranks heads for --keep-heads (default: attr, else the first in the file)."),
    effectiveness: Optional[Path] = typer.Option(None, "--effectiveness", help="A store of the model on --data: run the paper's per-example effectiveness analysis on its examples."),
    ks: Optional[str] = typer.Option(None, "--ks", help="Heads pruned per layer in the effectiveness analysis (default 2,4,...,all)."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    truncate: bool = options.truncate(),
    split: str = typer.Option("held-out", "--split", help="With a --data JSONL of pairs: held-out (default) draws the curves only on pairs no importance table was averaged over (MIB's protocol); none on every picked pair (the same-pairs curves)."),
    metric: Optional[str] = typer.Option(None, "--metric", help="With a --data JSONL of clean / counterfactual pairs and --model a causal language model: the curves' metric, the mean over the pairs of logit-diff (the default; answer - foil), logprob-diff or prob."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the curves (and the effectiveness analysis) into FILE.png or FILE.svg."),
    as_json: bool = options.as_json(),
    as_csv: bool = options.as_csv(),
    quiet: bool = options.quiet(),
) -> None:
    """Mask the least important heads at each rate and evaluate, for every method of an importance file.

    One global ranking of all heads per method; every method against the same unpruned
    baseline; random tables averaged. With --keep-heads and --save-model, also save a model with
    the heads really removed. Prints the CURVES.json path on stdout (--json/--csv: the curves,
    one row per rate and method).
    """
    with edge():
        from ..api import prune as run

        keep = options.pick(keep_heads, keep_old)
        with progress_bar("prune", quiet) as bar, renamed_options(*FLAGS):
            res = run(model, importance_path, data=data, task=task, examples=examples, rates=rates, methods=methods,
                      batch_size=batch_size, keep_heads=keep, save_model=save_model, keep_method=keep_method,
                      effectiveness=effectiveness, ks=parse_int_list(ks, "--ks"), device=device, truncate=truncate,
                      out=out_path, progress=bar, command=command_line(), metric=metric, threads=threads, split=split)
        e = res.effectiveness or {}
        store_notes(e.get("skipped_nonfinite"), e.get("unconverged"), e.get("used"))
        if not quiet and not (as_json or as_csv):
            if res.curves is not None:
                _report_curves(res.curves)
            if res.effectiveness is not None:
                _report_effectiveness(res.effectiveness)
        if res.pruned_model is not None:  # where the saved model went: said even with -q
            _report_saved(res.pruned_model)
        if plot is not None:
            res.plot(plot)
            if not quiet:
                err.print(f"plot: {plot}", markup=False)
        if as_json or as_csv:
            options.print_rows(_rows(res), "json" if as_json else "csv")
        else:
            out.print(str(out_path), markup=False)


def _rows(res) -> list[dict]:
    rows = []
    c = res.curves
    if c is not None:
        for name, per in c["methods"].items():
            # column: key in per; a language-model pair task: the metric's own band, and the faithfulness
            columns = ({"accuracy": "accuracy", "accuracy_low": "accuracy_low", "accuracy_high": "accuracy_high"}
                       if "accuracy" in per else
                       {"low": f"{c['metric']}_low", "high": f"{c['metric']}_high", "faithfulness": "faithfulness"})
            for i, r in enumerate(c["rates"]):
                row = {"analysis": "curves", "method": name, "rate": r, "metric": c["metric"],
                       "value": per[c["metric"]][i]}
                row.update({col: (per.get(key) or [None] * len(c["rates"]))[i] for col, key in columns.items()})
                for other, t in (c["methods"].get("attr", {}).get("tests") or {}).items():
                    if name == "attr":
                        row[f"p_attr_vs_{other}"] = t["p"][i]
                        row[f"p_holm_attr_vs_{other}"] = t["p_holm"][i]
                rows.append(row)
    e = res.effectiveness
    if e is not None:
        for name, entry in e["orders"].items():
            for k, a in zip(e["ks"], entry["accuracy"]):
                rows.append({"analysis": "effectiveness", "method": name, "k": k, "metric": "accuracy", "value": a})
    return rows


def _report_saved(info: dict) -> None:
    full, pruned = info["params_unpruned"], info["params_pruned"]
    err.print(
        f"pruned model: {info['folder']}: {info['heads_kept']}/{info['heads_total']} heads by {info['method']}, "
        f"{pruned:,} parameters vs {full:,} ({pruned / full:.1%}); one pass over "
        f"{info['n_examples']} examples {info['seconds_pruned']:.2f} s vs {info['seconds_unpruned']:.2f} s unpruned "
        f"({info['speedup']:.2f}x); max |logit - masked logit| {info['max_abs_logit_diff_vs_masked']:.1e}",
        markup=False,
    )


def _report_curves(c: dict) -> None:
    metric = c["metric"]
    t = Table(title=f"{metric} with the least important heads masked ({c['n_examples']} examples; "
                    f"unpruned {c['baseline'][metric]:.4f})", show_edge=False)
    level = c.get("level", 0.95)
    seeded = [n for n, m in c["methods"].items() if m.get("seeds")]
    tests = (c["methods"].get("attr") or {}).get("tests") or {}
    for col in ("pruned", *c["methods"], *(f"{n} orders" for n in seeded), *(f"p vs {n}" for n in tests)):
        t.add_column(col, justify="right")

    band = "accuracy" if "accuracy" in c["baseline"] else metric  # a pair task's curves carry their metric's band

    def cell(m, i):
        v = f"{m[metric][i]:.3f}"
        lo, hi = (m.get(f"{band}_low") or [None] * (i + 1))[i], (m.get(f"{band}_high") or [None] * (i + 1))[i]
        return v if lo is None or hi is None else f"{v} [{lo:.3f}, {hi:.3f}]"

    for i, r in enumerate(c["rates"]):
        t.add_row(f"{r:.0%}", *[cell(c["methods"][n], i) for n in c["methods"]],
                  *[f"{c['methods'][n][f'{band}_seed_min'][i]:.3f}..{c['methods'][n][f'{band}_seed_max'][i]:.3f}"
                    for n in seeded],
                  *[p_text(tests[n]["p_holm"][i]) for n in tests])
    wide_err().print(t)
    notes = [f"[low, high]: {level:.0%} bootstrap interval of the {band} over the examples"]
    if "zeroed" in c:
        notes.append(f"every head zeroed: {metric} {c['zeroed'][metric]:.4f}; faithfulness in the JSON"
                     " ((pruned - zeroed) / (unpruned - zeroed))")
    rnd = c["methods"].get("random") or {}
    if rnd.get("seeds"):
        notes.append(f"random: the mean of {rnd['seeds']} orders; random orders: the range of their {band} values")
    if tests:
        keeps = "keeps more right" if band == "accuracy" else f"keeps the {metric} higher"
        notes.append(f"p vs M: attr {keeps} than M, Holm-adjusted over the rates; " + c.get("tests", ""))
    err.print("\n".join(notes), markup=False)


def _report_effectiveness(e: dict) -> None:
    t = Table(title=f"effectiveness: accuracy (mean over layers) with k heads per layer pruned per example "
                    f"({e['n_examples']} examples; unpruned {e['baseline_accuracy']:.4f})", show_edge=False)
    t.add_column("order")
    for k in e["ks"]:
        t.add_column(f"k={k}", justify="right")
    for name, entry in e["orders"].items():
        lo, hi = entry.get("accuracy_low"), entry.get("accuracy_high")
        t.add_row(name.replace("_", " "), *[f"{a:.4f}" + ("" if lo is None or lo[i] is None else f" [{lo[i]:.3f}, {hi[i]:.3f}]")
                                            for i, a in enumerate(entry["accuracy"])])
        test = entry.get("test_vs_attention")
        if test:
            t.add_row(f"  p: attr {'>' if test['alternative'] == 'greater' else '<'} attention (Holm)",
                      *[p_text(x) for x in test["p_holm"]])
    wide_err().print(t)
    err.print(f"[low, high]: {e.get('level', 0.95):.0%} bootstrap interval over the examples; p: {e.get('tests', '')}",
              markup=False)
