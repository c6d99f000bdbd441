"""`attattr faithfulness`: is it an explanation? Token importance methods side by side."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path
from typing import Optional

import typer

from ..errors import OptionError
from ..fileio import replaced, write_atomic
from . import options
from .common import command_line, edge, err, out, parse_int_list, progress_bar, skipped_line, wide_err

# analysis.token_importance.METHODS' names, written out so that `attattr --help` need not import
# torch (tests/test_startup.py checks that they agree)
METHODS = ("attention_last", "attention_mean", "rollout", "attn_grad", "attr", "attr_cls", "grad", "input_x_grad",
           "loo", "random")



def _fmt(v, se=None, lo=None, hi=None) -> str:
    if v is None:
        return "–"
    return (f"{v:+.3f}" + (f" ±{se:.3f}" if se is not None else "")
            + (f" [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else ""))


def _ci(r, key, se=True):
    return _fmt(r[key], r.get(f"{key}_se") if se else None, r.get(f"{key}_low"), r.get(f"{key}_high"))


METHODS_HELP = ", ".join(METHODS)


def _table(report: dict):
    from rich.table import Table


    t = Table(title=f"faithfulness: {report.get('model')} ({report.get('task') or 'data'}), "
                    f"{report['examples']} examples, target {report.get('target')}", title_justify="left")
    for col in ("method", "τ with LOO", "τ |·| with |LOO|", "τ with grad", "AOPC comp ↑", "AOPC suff ↓", "deletion AUC ↓"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for m, r in report["methods"].items():
        t.add_row(m, _ci(r, "tau_loo"), _ci(r, "tau_loo_abs"), _ci(r, "tau_grad"),
                  _ci(r, "comprehensiveness", False), _ci(r, "sufficiency", False), _ci(r, "deletion_auc", False))
    t.caption = "±: standard error; \\[low, high]: 95 % bootstrap interval over the examples"
    return t


def _paired_table(report: dict):
    from rich.table import Table

    tests = report.get("paired_tests") or []
    if not tests:
        return None
    t = Table(title="paired tests on the same examples: attribution minus each attention baseline "
                    "(sign-flip permutation, one-sided towards the better direction; Holm over all rows)",
              title_justify="left")
    for col in ("method", "baseline", "metric", "better", "difference", "p", "p (Holm)"):
        t.add_column(col, justify="left" if col in ("method", "baseline", "metric", "better") else "right")
    for r in tests:
        t.add_row(r["method"], r["baseline"], r["metric"], r["better"], _fmt(r["difference"]), _p(r["p"]),
                  _p(r["p_holm"]))
    return t


def _p(x) -> str:
    return "–" if x is None else (f"{x:.2g}" if x >= 0.001 else f"{x:.1e}")


def _perm_table(report: dict):
    from rich.table import Table

    p = report.get("permutation")
    if not p:
        return None
    t = Table(title=f"permutation test: attention of one layer permuted ({p['permutations']} permutations per example); "
                    "TVD of the output distributions, median per example", title_justify="left")
    for col in ("layer", "mean of medians", "median of medians", "examples with median < 0.05"):
        t.add_column(col, justify="right")
    for i, layer in enumerate(p["layers"]):
        t.add_row(str(layer), f"{p['median_tvd_mean'][i]:.4f}", f"{p['median_tvd_median'][i]:.4f}",
                  f"{100 * p['share_below_0.05'][i]:.1f} %")
    return t


def _csv(report: dict) -> bytes:
    from ..analysis.faithfulness import report_rows

    rows = report_rows(report)
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if v is None else v) for k, v in r.items()})
    return buf.getvalue().encode()


def faithfulness(
    store: Optional[Path] = typer.Argument(None, help="An attattr store (from `attattr score`); omit it to score --model/--data first."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Report to write (JSON): per method and per example."),
    model: Optional[str] = options.model("Local model folder or hub id (default: the store's model, or the built-in default)."),
    data: Optional[str] = options.data(),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples(),
    methods: Optional[str] = typer.Option(None, "--methods", help="Comma-separated token importance methods (default: all): " + METHODS_HELP + "."),
    store_out: Optional[Path] = typer.Option(None, "--store", help="With --model/--data: the store to score into (default: --out with .h5); resumed when it exists."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Integration steps m of a fixed rule instead of --tol (with --model/--data; 20 with --rule)."),
    rule: Optional[str] = typer.Option(None, "--rule", help="A fixed quadrature rule instead of --tol (with --model/--data; right with --steps 20 is the paper's)."),
    tol: Optional[float] = typer.Option(None, "--tol", help="Error-controlled integration to this tolerance (with --model/--data; the default, 0.1, without --steps or --rule)."),
    target: str = typer.Option("predicted", "--target", help="Class to explain: predicted, gold, a label name or index (with --model/--data)."),
    logit: bool = typer.Option(False, "--logit/--prob", help="Explain the target's logit instead of its probability (gradients and attribution; with --model/--data)."),
    erase: str = typer.Option("remove", "--erase", help="How a token is erased for LOO and the erasure metrics: remove (drop the word piece) or mask (the [MASK] token)."),
    permutations: int = typer.Option(20, "--permutations", help="Random permutations per example and layer for the permutation test (0: skip it)."),
    perm_layers: Optional[str] = typer.Option(None, "--perm-layers", help="Layers for the permutation test, e.g. 0,5 (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random baseline and of the permutations."),
    csv_path: Optional[Path] = typer.Option(None, "--csv", help="Also write one CSV row per method."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw deletion curves and taus (.png, .svg or .pdf)."),
    device: str = options.device(),
    truncate: bool = options.truncate(),
    as_json: bool = options.as_json(),
    quiet: bool = options.quiet(),
) -> None:
    """Faithfulness of token importance: raw attention, rollout, attention x gradient, attention attribution, gradients, leave-one-out and a random baseline, side by side (Jain & Wallace 2019; ERASER).

    Per method over the examples: Kendall tau-b with leave-one-out and with gradient norms, AOPC comprehensiveness and sufficiency, deletion curves; per layer, the permutation test of the attention (total variation distance of the outputs). Token importance is kept in the store.

    Given a STORE it reads it and loads its model; otherwise it first scores --model/--data (or, given neither, the built-in default) into --store. Prints the report's path on stdout.
    """
    with edge():
        from ..analysis.faithfulness import plot_report, report_rows
        from ..analysis.token_importance import ERASE_MODES, check_methods
        from ..api import faithfulness as run

        chosen = check_methods(methods.split(",") if methods else list(METHODS))
        if erase not in ERASE_MODES:
            raise OptionError(f"unknown --erase '{erase}'; available: {', '.join(ERASE_MODES)}")
        for p, kinds in ((plot, (".png", ".svg", ".pdf")), (csv_path, (".csv", ".tsv", ".txt"))):
            if p is not None and p.suffix.lower() not in kinds:
                raise OptionError(f"cannot tell the format of {p}: use one of {', '.join(kinds)}")
        for p in (out_path, csv_path, plot):  # before any work, not after it
            if p is not None and p.is_dir():
                raise OptionError(f"{p} is a directory")
            if p is not None and not p.parent.exists():
                raise OptionError(f"cannot write {p}: the folder {p.parent} does not exist")
        t0 = time.perf_counter()
        if store is None and (store_out or out_path.with_suffix(".h5")).resolve() == out_path.resolve():
            raise OptionError(f"--store and --out are the same file ({out_path}): give the report a .json name")
        if store is not None and (data is not None or task is not None):
            raise OptionError("give either a STORE or --model/--data/--task, not both")
        with progress_bar("faithfulness", quiet) as bar:
            res = run(store, model=model, data=data, task=task, examples=examples, methods=chosen,
                      score_store=store_out or (out_path.with_suffix(".h5") if store is None else None),
                      steps=steps, rule=rule, tol=tol, target=target, output="logit" if logit else "prob", erase=erase,
                      permutations=permutations, perm_layers=parse_int_list(perm_layers, "--perm-layers"), seed=seed,
                      device=device, truncate=truncate, progress=bar, command=command_line())
        report = res.report
        store = res.store
        report["seconds"] = round(time.perf_counter() - t0, 2)
        write_atomic(out_path, (json.dumps(report, indent=1, allow_nan=False) + "\n").encode())
        if csv_path is not None:
            write_atomic(csv_path, _csv(report))
        if report.get("skipped_nonfinite"):
            err.print(skipped_line(report["skipped_nonfinite"]), markup=False)
        if plot is not None:
            with replaced(plot, suffix=plot.suffix) as tmp:
                plot_report(report, tmp)
        if as_json:
            options.print_rows(report_rows(report), "json")
        if not quiet and not as_json:
            tables = wide_err()
            tables.print(_table(report))
            perm = _perm_table(report)
            if perm is not None:
                tables.print(perm)
            paired = _paired_table(report)
            if paired is not None:
                tables.print(paired)
            err.print(f"{report['examples']} examples, {report['forwards']} forward passes, {report['seconds']:.1f} s; "
                      f"token importance kept in {store}", markup=False)
        if not as_json:
            out.print(str(out_path), markup=False)
