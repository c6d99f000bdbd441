"""`attattr faithfulness`: is it an explanation? Token importance methods side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..errors import OptionError
from . import options
from .common import (FLAGS, command_line, edge, err, out, p_text, parse_int_list, progress_bar, renamed_options,
                     store_notes, wide_err)

# the registry of token importance methods imports NumPy only, so `attattr --help` stays quick
from ..api.tools import FAITHFULNESS_DEFAULT as METHODS, FAITHFULNESS_METHODS as ALL_METHODS  # noqa: E402


DASH = "–"


def _fmt(v, se=None, lo=None, hi=None) -> str:
    if v is None:
        return DASH
    return (f"{v:+.3f}" + (f" ±{se:.3f}" if se is not None else "")
            + (f" [{lo:+.2f}, {hi:+.2f}]" if lo is not None and hi is not None else ""))


def _ci(r, key, se=True):
    return _fmt(r[key], r.get(f"{key}_se") if se else None, r.get(f"{key}_low"), r.get(f"{key}_high"))


METHODS_HELP = ", ".join(METHODS)
MORE_METHODS_HELP = ", ".join(m for m in ALL_METHODS if m not in METHODS)


def _new_table(title: str, columns) -> Table:
    """A table titled on the left: its "method" and "against" columns text, the others numbers."""
    t = Table(title=title, title_justify="left")
    for col in columns:
        t.add_column(col, justify="left" if col in ("method", "against") else "right")
    return t


def _table(report: dict):
    t = _new_table(f"faithfulness: {report.get('model')} ({report.get('task') or 'data'}),"
                   f" {report['examples']} examples, target {report.get('target')}"
                   + (", over words" if (report.get("settings") or {}).get("aggregate") == "words" else ""),
                   ("method", "τ with LOO", "τ |·| with |LOO|", "τ with grad", "AOPC comp ↑", "AOPC suff ↓",
                    "deletion AUC ↓"))
    for m, r in report["methods"].items():
        t.add_row(m, _ci(r, "tau_loo"), _ci(r, "tau_loo_abs"), _ci(r, "tau_grad"),
                  _ci(r, "comprehensiveness", False), _ci(r, "sufficiency", False), _ci(r, "deletion_auc", False))
    t.caption = "±: standard error; \\[low, high]: 95 % bootstrap interval over the examples"
    return t


def _mask_table(report: dict):
    """DecompX's masking protocol, one row per method."""
    if not any(r.get("mask_aopc") is not None for r in report["methods"].values()):
        return None
    t = _new_table("masking protocol (DecompX): the top 10, 20, …, 90 % of the tokens replaced by the mask token, "
                   "averaged over K", ("method", "mask AOPC ↑", "NAOPC ↑", "accuracy masked ↓", "prediction kept ↓"))
    for m, r in report["methods"].items():
        t.add_row(m, _ci(r, "mask_aopc", False), _ci(r, "mask_naopc", False), _ci(r, "mask_accuracy", False),
                  _ci(r, "mask_kept", False))
    t.caption = ("NAOPC: per example between the best and worst AOPC of the orders at hand (every method's, LOO's and "
                 "its reverse); \\[low, high]: 95 % bootstrap interval")
    return t


def _adversarial_table(report: dict):
    a = report["adversarial"]
    t = _new_table(f"adversarial attention (layer {a['layer']}, pooled row of every head): max JSD of attention "
                   "within ε TVD of the output, and how far attention attribution moved",
                   ("ε", "JSD attention (heads) ↑", "JSD attention (tokens)", "JSD attribution (tokens)", "τ attention",
                    "τ attribution", "TVD output", "steps", "attribution moved less: p (JSD, τ)"))
    for eps, e in a["summary"].items():
        less = e["attribution_moved_less"]
        t.add_row(eps, *[_fmt(e[k]["mean"], None, e[k]["low"], e[k]["high"])
                         for k in ("jsd_attention", "jsd_attention_tokens", "jsd_attribution_tokens", "tau_attention",
                                   "tau_attribution", "tvd_output")],
                  f"{e['steps']['mean']:.0f}" if e["steps"]["mean"] is not None else DASH,
                  f"{p_text(less['jsd']['p'], DASH)}, {p_text(less['tau']['p'], DASH)}")
    t.caption = ("means over examples [95 % bootstrap interval]; JSD in nats (at most 0.693); τ: Kendall τ-b between the clean "
                 "and the adversarial token maps; p: paired sign-flip test, one-sided")
    return t


def _paired_table(report: dict):
    """One row per (attribution method, other method), one column per metric: the mean
    paired difference and its Holm-adjusted p."""
    tests = report["paired_tests"]
    better = {r["metric"]: r["better"] for r in tests}  # the metrics in their first order
    t = _new_table("paired tests on the same examples: attribution minus each other method, mean difference "
                   "(Holm-adjusted p; sign-flip permutation, one-sided towards the better direction, Holm over all"
                   " cells)",
                   ("method", "against", *(f"{m} ({b})" for m, b in better.items())))
    cells: dict = {}
    for r in tests:
        cells.setdefault((r["method"], r["baseline"]), {})[r["metric"]] = r
    for (a, b), row in cells.items():
        t.add_row(a, b, *[(_fmt(row[m]["difference"]) + f" ({p_text(row[m]['p_holm'], DASH)})") if m in row else DASH
                          for m in better])
    return t


def _perm_table(report: dict):
    p = report["permutation"]
    t = _new_table(f"permutation test: attention of one layer permuted ({p['permutations']} permutations per example); "
                   "TVD of the output distributions, median per example",
                   ("layer", "mean of medians", "median of medians", "examples with median < 0.05"))
    for i, layer in enumerate(p["layers"]):
        t.add_row(str(layer), f"{p['median_tvd_mean'][i]:.4f}", f"{p['median_tvd_median'][i]:.4f}",
                  f"{100 * p['share_below_0.05'][i]:.1f} %")
    return t


def faithfulness(
    store: Optional[Path] = typer.Argument(None, help="An attattr store (from `attattr score`); omit it to score --model/--data first."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Report to write (JSON): per method and per example. Needed unless --json or --csv prints the table instead."),
    model: Optional[str] = options.model("Local model folder or hub id (default: the store's model, or the built-in default)."),
    data: Optional[str] = options.data(),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples(),
    methods: Optional[str] = typer.Option(None, "--methods", help="Comma-separated token importance methods, or all (every method available for the model). Default: " + METHODS_HELP + "; by name or with all also: " + MORE_METHODS_HELP + "."),
    store_out: Optional[Path] = typer.Option(None, "--store", help="With --model/--data: the store to score into (default: --out with .h5); resumed when it exists."),
    importance_store: Optional[Path] = typer.Option(None, "--importance-store", help="With a STORE: keep the token importance computed in this store for the next run (a copy of STORE made on first use, or STORE itself when it names it). Default: STORE is only read, never changed."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Integration steps m of a fixed rule instead of --tol (with --model/--data; 20 with --rule)."),
    rule: Optional[str] = typer.Option(None, "--rule", help="A fixed quadrature rule instead of --tol (with --model/--data; right with --steps 20 is the paper's)."),
    tol: Optional[float] = typer.Option(None, "--tol", help="Error-controlled integration to this tolerance (with --model/--data; the default, 0.1, without --steps or --rule)."),
    target: str = typer.Option("predicted", "--target", help="Class to explain: predicted, gold, a label name or index (with --model/--data)."),
    logit: bool = typer.Option(False, "--logit/--prob", help="Explain the target's logit instead of its probability (gradients and attribution; with --model/--data)."),
    erase: str = typer.Option("remove", "--erase", help="How a token is erased for LOO and the erasure metrics: remove (drop the word piece) or mask (the [MASK] token)."),
    permutations: int = typer.Option(20, "--permutations", help="Random permutations per example and layer for the permutation test (0: skip it)."),
    perm_layers: Optional[str] = typer.Option(None, "--perm-layers", help="Layers for the permutation test, e.g. 0,5 (default: all)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random baseline, the permutations and the adversarial search."),
    adversarial: bool = typer.Option(False, "--adversarial", help="Also run the adversarial-attention experiment (Jain & Wallace 2019, 4.2) and compare attention attribution under it."),
    epsilons: Optional[str] = typer.Option(None, "--epsilons", help="With --adversarial: output TVD bounds, e.g. 0.01,0.05 (the default)."),
    adversarial_layer: int = typer.Option(-1, "--adversarial-layer", help="With --adversarial: the layer whose attention is searched (default: the last)."),
    aggregate: Optional[str] = typer.Option(None, "--aggregate", help="words: rank, erase and compare whole words (a word's score the sum of its tokens'; erasing a word erases all its tokens); tokens (default): as scored."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw deletion curves and taus (.png, .svg or .pdf)."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    truncate: bool = options.truncate(),
    as_json: bool = options.as_json(),
    as_csv: bool = options.as_csv("Print one CSV row per method (and per epsilon with --adversarial) on stdout instead of the report's path."),
    quiet: bool = options.quiet(),
) -> None:
    """Faithfulness of token importance: raw attention, rollout, attention x gradient, attention attribution, gradients, leave-one-out and a random baseline, side by side (Jain & Wallace 2019; ERASER); with --methods all also Integrated Gradients, ALTI, value zeroing and DecompX.

    Per method over the examples: Kendall tau-b with leave-one-out and with gradient norms, AOPC comprehensiveness and sufficiency, deletion curves, AOPC, normalised AOPC and accuracy after masking the top 10..90 % (DecompX's protocol); per layer, the permutation test of the attention (total variation distance of the outputs); with --adversarial, adversarial attention within ε TVD of the output and how far attention attribution moves under it. STORE is only read (it may be read-only): token importance already in it is used, the rest computed; --importance-store keeps what is computed.

    Given a STORE it reads it and loads its model; otherwise it first scores --model/--data (or, given neither, the built-in default) into --store. Prints the report's path on stdout.
    """
    with edge():
        from ..api import faithfulness as run
        from ..api.groups import Adversarial, Compute, Integration, Target

        eps = None
        if epsilons is not None:
            if not adversarial:
                raise OptionError("--epsilons goes with --adversarial")
            try:
                eps = [float(x) for x in epsilons.split(",") if x.strip()]
            except ValueError:
                raise OptionError(f"--epsilons: not a list of numbers: {epsilons}") from None
            if not eps or any(not 0 < e < 1 for e in eps):
                raise OptionError(f"--epsilons are total variation distances in (0, 1), got {epsilons}")
        if as_json and as_csv:
            raise OptionError("give --json or --csv, not both")
        if out_path is None and not (as_json or as_csv):
            raise OptionError("give --out (the report to write), or --json or --csv to print the table instead")
        if plot is not None and plot.suffix.lower() not in (".png", ".svg", ".pdf"):
            raise OptionError(f"cannot tell the format of {plot}: use one of .png, .svg, .pdf")
        for p in filter(None, (out_path, plot)):  # before any work, not after it
            if p.is_dir():
                raise OptionError(f"{p} is a directory")
            if not p.parent.exists():
                raise OptionError(f"cannot write {p}: the folder {p.parent} does not exist")
        names = (*FLAGS, "methods", "erase", "epsilons", "perm_layers", "score_store", "importance_store", "aggregate")
        with progress_bar("faithfulness", quiet) as bar, renamed_options(*names):
            res = run(store, model=model, data=data, task=task, examples=examples,
                      methods=methods.split(",") if methods is not None else list(METHODS),
                      score_store=store_out or (out_path.with_suffix(".h5") if store is None and out_path else None),
                      importance_store=importance_store, erase=erase, permutations=permutations,
                      perm_layers=parse_int_list(perm_layers, "--perm-layers"), seed=seed, aggregate=aggregate,
                      adversarial=Adversarial(epsilons=eps, layer=adversarial_layer) if adversarial else False,
                      target=Target(target=target, output="logit" if logit else "prob"),
                      integration=Integration(steps=steps, rule=rule, tol=tol),
                      compute=Compute(device=device, truncate=truncate, threads=threads),
                      out=out_path, progress=bar, command=command_line())
        report = res.report
        for note in report.get("left_out") or []:
            err.print(note, markup=False)
        store_notes(report.get("skipped_nonfinite"), report.get("unconverged"), report["examples"])
        ig = (report.get("completeness") or {}).get("ig")
        if ig and ig["examples"]:
            err.print(f"ig: completeness error at most {ig['max_abs_error']:.2g} on {ig['examples']} examples "
                      f"(tolerance {ig['tolerance']:g} of each example's scale, up to {ig['max_steps_used']} points)"
                      + (f"; {ig['flagged']} flagged at the point cap: {ig['flagged_examples'][:5]}" if ig["flagged"] else ""),
                      markup=False)
        if plot is not None:
            res.plot(plot)
        if as_json:
            options.print_rows(res.rows, "json")
            return
        if as_csv:
            out.file.write(res.to_csv())
            return
        if not quiet:
            tables = wide_err()
            for make, section in ((_table, None), (_mask_table, None), (_perm_table, "permutation"),
                                  (_adversarial_table, "adversarial"), (_paired_table, "paired_tests")):
                t = make(report) if section is None or report.get(section) else None  # a section left out: no table
                if t is not None:
                    tables.print(t)
            err.print(f"{report['examples']} examples, {report['forwards']} forward passes, {report['seconds']:.1f} s"
                      + (f"; token importance kept in {res.store}" if res.store else ""), markup=False)
        out.print(str(out_path), markup=False)
