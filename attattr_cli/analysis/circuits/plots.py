"""Pictures of a circuit result: the faithfulness curves and a layer x head heatmap."""

from __future__ import annotations

import numpy as np

from ..plots import new_figure as _figure, short_title


def curves_figure(result, absolute: bool = False):
    """f(k) against the share of heads kept (log scale, as MIB draws it), one line per method;
    the legend carries CPR (signed ranking) or CMD (absolute ranking)."""
    fig = _figure(6.4, 4.0, layout="constrained")
    ax = fig.subplots()
    ks = np.asarray(result.percentages) * 100
    for name, r in result.methods.items():
        y = r.curve_abs if absolute else r.curve
        tag = f"CMD {r.cmd:.3f}" if absolute else f"CPR {r.cpr:.3f}"
        star = " *" if name == result.recommended else ""
        ax.plot(ks, y, marker="o", ms=3, lw=2.2 if star else 1.2, label=f"{name}{star} ({tag})")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.axhline(0.0, color="grey", lw=0.5)
    ax.set_xscale("log")
    ax.set_xlabel("heads kept (%); the others ablated by " + result.ablation)
    ax.set_ylabel("faithfulness f = (m(C) - m(∅)) / (m(N) - m(∅))")
    sp = getattr(result, "split", None) or {}
    seen = "" if not sp or sp.get("same_pairs") else f" (methods ranked on {len(sp['fit'])} others)"
    ax.set_title(short_title(f"{result.model}: curve on {result.n_pairs} pairs{seen}, ranking by "
                             + ("|score|" if absolute else "signed score")), fontsize=10)
    ax.legend(fontsize=7, loc="best")
    return fig


def heatmap_figure(result, method: str):
    r = result.methods[method]
    L, H = r.scores.shape
    fig = _figure(max(3.0, 0.35 * H + 2.0), max(2.5, 0.22 * L + 1.2), layout="constrained")
    ax = fig.subplots()
    v = np.abs(r.scores).max() or 1.0
    im = ax.imshow(r.scores, aspect="auto", cmap="RdBu_r", vmin=-v, vmax=v, interpolation="nearest")
    ax.set_xlabel("head" if H == result.heads else "head (last column: the layer's MLP)")
    ax.set_ylabel("layer")
    sp = getattr(result, "split", None) or {}
    n = len(sp["fit"]) if sp.get("fit") else result.n_pairs  # the scores are the mean over the pairs the methods saw
    ax.set_title(short_title(f"{method}: head scores ({result.metric}, mean over {n} pairs)"), fontsize=9)
    fig.colorbar(im, ax=ax, shrink=0.9)
    return fig
