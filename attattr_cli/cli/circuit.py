"""`attattr circuit`: which heads carry a behaviour, judged by MIB's faithfulness curve."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import edge, err, out, progress_bar, renamed_options

# circuit writes its outputs only when it has finished, each whole or not at all: Ctrl-C leaves them as they were
INTERRUPTED = ("nothing is written before the end, and each output is written whole or left untouched (a circuit run "
               "does not resume: run it again).")


def circuit(
    data: Path = typer.Option(..., "--data", help="Counterfactual pairs, JSONL: prompt, counterfactual, answer, foil per line (attattr demo data --task ioi writes them)."),
    model: Optional[str] = options.model(),
    lm: bool = typer.Option(False, "--lm", help="Accepted as score takes it: circuits always load the model as a causal language model."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Head methods, a comma list or 'all' (default: atp-verified, attr-gates, atp, nap-ig; the recommended one, atp-verified, is always computed)."),
    ablation: str = typer.Option("patching", "--ablation", help="What a head outside the circuit becomes: patching (its output on the counterfactual prompt), mean, zero."),
    metric: str = typer.Option("logit-diff", "--metric", help="The metric per pair: logit-diff (answer - foil), logprob-diff, prob."),
    nodes: str = typer.Option("heads", "--nodes", help="The nodes: heads (attention heads), or heads+mlp (also each layer's MLP output, as MIB's node level; methods that score heads only are refused)."),
    steps: Optional[int] = typer.Option(None, "--steps", help="Integration nodes of the path methods (default: each method's own)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the random ranking and of the bootstrap."),
    split: str = typer.Option("half", "--split", help="MIB's protocol: half (default) gives a seeded half of the pairs (--seed) to the methods and measures the curve on the other half; a fraction sets the methods' share; none uses every pair for both (the same-pairs figures)."),
    verify: Optional[int] = typer.Option(None, "--verify", help="Heads of largest |AtP| that atp-verified and attr-tiers patch exactly (default 15; each costs about one forward per pair)."),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples over pairs for the intervals."),
    out_path: Optional[Path] = typer.Option(None, "--out", "-o", help="Also write the result as HDF5 (scores, per-pair scores, curves)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Also write the result as JSON ('-': to stdout instead of the table)."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the faithfulness curves into FILE.png, .svg or .pdf."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    quiet: bool = options.quiet(),
) -> None:
    """Rank attention heads on counterfactual pairs and judge each ranking by MIB's curve.

    Keeps the top k % of heads (k = 0.1 ... 100), ablates every other head, and reports per
    method CPR (area under f, higher is better), CMD (area under |1 - f|, lower is better) with
    bootstrap intervals, the Spearman correlation with exact patching (when computed) and the
    CPU seconds per pair. The table goes to stdout.
    """
    with edge(interrupted=INTERRUPTED):
        from ..api.circuits import circuit as run

        to_stdout = json_path is not None and str(json_path) == "-"
        with progress_bar("circuit", quiet) as bar, renamed_options("data", "out", "json", "methods", "plot"):
            result = run(model, str(data), methods=methods, ablation=ablation, metric=metric, nodes=nodes,
                         steps=steps, seed=seed, bootstrap=bootstrap, split=split, verify=verify, device=device, progress=bar,
                         out=out_path, json=None if to_stdout else json_path, threads=threads, plot=plot)
        if to_stdout:
            out.print(result.to_json(), markup=False, soft_wrap=True)
            return
        out.print(table(result), markup=False, soft_wrap=True)
        if not quiet:
            err.print(f"m(N) {result.clean:.4g}, m(empty) {result.empty:.4g} over {result.n_pairs} pairs "
                      f"(metric {result.metric}, ablation {result.ablation}{result.describe_split()}); recommended: {result.recommended}",
                      markup=False)


def table(result) -> str:
    """Plain text: one row per method, then each method's curve."""
    head = f"{'method':<14}{'CPR':>7} {'[95% CI]':<17}{'CMD':>7} {'[95% CI]':<17}{'Spearman':>9}{'top10':>6}{'CPU s/pair':>11}"
    lines = [head]
    for r in result._rows():
        sp = "" if r["spearman_patching"] is None else f"{r['spearman_patching']:.3f}"
        top = "" if r["top10_shared"] is None else str(r["top10_shared"])
        name = r["method"] + ("*" if r["method"] == result.recommended else "")
        lines.append(f"{name:<14}{r['cpr']:>7.3f} [{r['cpr_low']:.3f}, {r['cpr_high']:.3f}]".ljust(38)
                     + f"{r['cmd']:>7.3f} [{r['cmd_low']:.3f}, {r['cmd_high']:.3f}]".ljust(25)
                     + f"{sp:>9}{top:>6}{r['cpu_s_per_pair']:>11.2f}")
    ks = " ".join(f"{k * 100:g}%" for k in result.percentages)
    lines.append(f"curves f(k), k = {ks} (signed ranking | absolute ranking):")
    for name, r in result.methods.items():
        lines.append(f"  {name:<12} " + " ".join(f"{x:.2f}" for x in r.curve) + " | "
                     + " ".join(f"{x:.2f}" for x in r.curve_abs))
    return "\n".join(lines)
