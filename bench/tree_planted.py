"""Attribution trees on the built-in default: how often does the tree connect the planted pair?

Scores the synthetic held-out set with the shipped model (or reads a given store) and, for
each example, builds the attribution tree (default: paper mode, tau 0.4) and checks whether
both planted tokens are in the tree, whether one is an ancestor of the other (a path along
the tree's edges), and whether a single edge joins them.

Run: python bench/tree_planted.py [--store STORE] [--examples 0:200] [--tau 0.4] [--compat paper]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from attattr_cli.analysis.planted import planted_positions
from attattr_cli.analysis.stats import proportion_ci
from attattr_cli.analysis.tree import has_path, tree_for_example
from attattr_cli.engine.run import ScoreRequest, score_to_store
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.store import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default=None, help="read this store instead of scoring (must hold synthetic examples)")
    ap.add_argument("--examples", default=None, help="when scoring: default the whole held-out set (200)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--tau", type=float, default=0.4)
    ap.add_argument("--lam", type=float, default=None)
    ap.add_argument("--compat", default="paper", choices=["paper", "reference"])
    args = ap.parse_args()
    path = args.store
    if path is None:
        path = str(Path(tempfile.mkdtemp()) / "tree_planted.h5")
        t0 = time.perf_counter()
        report = score_to_store(ScoreRequest(out=path, examples=args.examples, options=ScoreOptions(steps=args.steps),
                                             command=["bench/tree_planted.py"]))
        print(f"built-in default: {report.total} held-out synthetic examples scored in {time.perf_counter() - t0:.1f} s "
              f"(steps {args.steps}, accuracy {report.accuracy:.3f})")
    total = both = path_ = direct = top_planted = rooted = 0
    sizes = []
    with Store(path) as s:
        for e in s:
            p, q = planted_positions(e.segment_ids, e.meta)
            g = tree_for_example(e, tau=args.tau, lam=args.lam, compat=args.compat)
            total += 1
            sizes.append(g.number_of_nodes())
            both += int(p in g and q in g)
            path_ += int(has_path(g, p, q))
            direct += int(g.has_edge(p, q) or g.has_edge(q, p))
            top_planted += int(g.graph["top"] in (p, q))
            # --root: rooted at either planted word, does the tree reach the other one?
            rooted += int(any(b in tree_for_example(e, tau=args.tau, lam=args.lam, compat=args.compat, top=a)
                              for a, b in ((p, q), (q, p))))
    if not total:
        raise SystemExit("the store holds no examples")
    def rate(k: int) -> str:
        lo, hi = proportion_ci(k, total)
        return f"{k / total:.3f} [{lo:.3f}, {hi:.3f}]"

    print(f"trees ({args.compat} mode, tau {args.tau:g}" + ("" if args.lam is None else f", lambda {args.lam:g}")
          + f") on {total} examples, {sum(sizes) / total:.1f} tokens per tree on average "
          "(rates with 95 % Wilson intervals):")
    print(f"  both planted tokens in the tree:        {rate(both)}")
    print(f"  planted pair connected by a tree path:  {rate(path_)}")
    print(f"  planted pair joined by a direct edge:   {rate(direct)}")
    print(f"  top node is a planted token:            {rate(top_planted)}")
    print(f"  rooted (--root) at one planted word, the tree reaches the other: {rate(rooted)}")


if __name__ == "__main__":
    main()
