"""The view of one example as a matplotlib figure (PNG, SVG or PDF): columns are layers, rows
attribution above attention per head choice, then the coloured tokens, the top-k table and the
tree (docs/views.md, "attattr view"). matplotlib is imported here only (never at package import).
"""

from __future__ import annotations

import io
import textwrap

import numpy as np

from ..errors import OptionError
from .colours import token_rgb
from .data import View, format_number

FIGURE_FORMATS = ("png", "svg", "pdf")
ATTR_CMAP = "RdBu_r"
ATTENTION_CMAP = "Greys"
MASKED = "#e3d9c6"
KIND_NAMES = {"attr": "attribution", "attention": "attention"}
MAX_WIDTH = 28.0  # inches: a figure's rows of panels wrap to stay within this
MAX_PIXELS = 6000  # a PNG's longer side: a larger figure is drawn at a lower resolution


def header_lines(view: View) -> list[str]:
    h = view.header
    first = f"example {h['index']}"
    if view.family != "self":
        first += f" · family {view.family}"
    first += f" · {h['summary']}"
    if h.get("correct") is False:
        first += " · WRONG"
    if h.get("truncated"):
        first += " · truncated"
    lines = [first]
    text = h["text_a"] if h.get("text_b") is None else f"{h['text_a']}  ||  {h['text_b']}"
    wrapped = textwrap.wrap("text: " + text, 110)
    lines += wrapped[:3] if len(wrapped) <= 3 else wrapped[:2] + [wrapped[2][:106] + " …"]
    resid = " ".join(f"L{l} {format_number(v, signed=True)}" for l, v in h["residual"].items())
    line = f"completeness residual per layer (f(x) - f(baseline) - sum of attribution): {resid}"
    if h.get("unconverged"):
        line += " · NOT CONVERGED: " + ", ".join(f"L{l} ({why})" for l, why in h["unconverged"].items())
    lines.append(line)
    return lines


def view_figure(view: View, tree_png: bytes | None = None):
    """A matplotlib Figure of the view (the caller saves or shows it); ``tree_png``, the
    attribution tree rendered by Graphviz, goes at the foot."""
    import matplotlib
    import matplotlib.image as mpimg
    from matplotlib.colors import Normalize, TwoSlopeNorm

    from .notebook import new_figure

    kinds = [k for k in ("attr", "attention") if k in view.maps]
    nq, nk = len(view.q_idx), len(view.k_idx)
    n_layers = max(len(view.layers), 1)
    big = max(nq, nk) > 24
    cell = 0.17 if big else 0.2
    panel_w = max(1.9, nk * cell)
    panel_h = max(1.9, nq * cell)
    label_w = 0.75 if max(map(len, view.key_tokens + view.query_tokens), default=4) > 6 else 0.55
    # panels per row: at most 8, and no more than fit MAX_WIDTH inches (wider figures wrap their layers into blocks)
    room = max(1, min(6 if big else 8, int((MAX_WIDTH - 1.6) // (panel_w + label_w))))
    per_row = min(n_layers, room)
    # each row of panels: (kind, [(layer position, head position), ...]), attention under attribution; layers
    # run across a row, and where they leave room (one layer, all heads, say) several heads share a row: a grid
    heads_per_row = max(1, room // n_layers)
    n_heads = len(view.heads)
    order = [(kind, [(lp, hi) for hi in range(g, min(g + heads_per_row, n_heads))
                     for lp in range(b, min(b + per_row, len(view.layers)))])
             for b in range(0, n_layers, per_row) for g in range(0, n_heads, heads_per_row) for kind in kinds]
    cols = max((len(panels) for _, panels in order), default=0)
    width = max(9.0, cols * (panel_w + label_w) + 1.6)
    wrapped = [w for line in header_lines(view) + view.notes for w in textwrap.wrap(line, int(width * 13))]
    header_h = 0.2 * len(wrapped) + 0.25
    step = panel_h + label_w + 0.35
    map_h = len(order) * step
    tokens = view.importance["tokens"]
    strip_lines = _strip_layout(tokens, width - 0.6)
    strip_title = textwrap.wrap(_strip_title(view), int(width * 12)) if tokens else []
    strip_h = 0.4 + 0.17 * len(strip_title) + 0.26 * (max(strip_lines[-1][1], 0) + 1) if tokens else 0
    table_h = 0.45 + 0.17 * len(view.topk) if view.topk else 0
    if tree_png:
        tree_img = mpimg.imread(io.BytesIO(tree_png), format="png")
        tree_w = min(tree_img.shape[1] / 96.0, width - 0.5)  # Graphviz renders at 96 dpi
        tree_h = tree_w * tree_img.shape[0] / tree_img.shape[1]
    height = header_h + map_h + strip_h + table_h + (tree_h + 0.3 if tree_png else 0) + 0.2
    fig = new_figure(width, height)

    y = height - 0.15
    for k, line in enumerate(wrapped):
        fig.text(0.25 / width, (y - 0.2 * k) / height, line, fontsize=9 if k else 10.5, va="top",
                 fontweight="bold" if k == 0 else "normal", family="DejaVu Sans")
    y -= header_h
    norms = {"attr": TwoSlopeNorm(vcenter=0.0, vmin=-view.scale.get("attr", 1.0), vmax=view.scale.get("attr", 1.0)),
             "attention": Normalize(vmin=0.0, vmax=view.scale.get("attention", 1.0))}
    cmaps = {kind: matplotlib.colormaps.get_cmap(name).with_extremes(bad=MASKED)
             for kind, name in (("attr", ATTR_CMAP), ("attention", ATTENTION_CMAP))}
    fs = 6 if big else 7
    x_ticks = [_tick(view.key_tokens[j], j, view.mode) for j in view.k_idx]
    y_ticks = [_tick(view.query_tokens[i], i, view.mode) for i in view.q_idx]
    for r, (kind, panels) in enumerate(order):
        top = y - r * step - 0.3
        im = None
        for c, (lp, hi) in enumerate(panels):
            head = view.heads[hi]
            left = 0.3 + label_w + c * (panel_w + label_w)
            ax = fig.add_axes((left / width, (top - panel_h) / height, panel_w / width, panel_h / height))
            data = np.asarray(view.maps[kind][lp, hi])
            if view.masked is not None:
                data = np.ma.masked_array(data, mask=view.masked)
            im = ax.imshow(data, cmap=cmaps[kind], norm=norms[kind], aspect="auto", interpolation="nearest")
            head_name = f"head {head}" if head != "sum" else ("sum of heads" if kind == "attr" else "mean of heads")
            ax.set_title(f"{KIND_NAMES[kind]} · layer {view.layers[lp]} · {head_name}", fontsize=8)
            ax.set_xticks(range(nk))
            ax.set_xticklabels(x_ticks, rotation=90, fontsize=fs)
            ax.set_yticks(range(nq))
            ax.set_yticklabels(y_ticks, fontsize=fs)
            ax.tick_params(length=1.5, pad=1)
        left = 0.3 + label_w + cols * (panel_w + label_w) - label_w + 0.15
        cax = fig.add_axes((left / width, (top - panel_h) / height, 0.12 / width, panel_h / height))
        cb = fig.colorbar(im, cax=cax)
        cb.ax.tick_params(labelsize=7)
        scale = view.scale[kind]
        cb.set_label(f"{KIND_NAMES[kind]} (shared: {'±' if kind == 'attr' else '0..'}{scale:.3g})", fontsize=8)
    if kinds and view.masked is not None:
        fig.text(0.3 / width, (y - map_h + 0.05) / height, "cells in this colour: masked (a causal model cannot look ahead)",
                 fontsize=7.5, color="#8a6d3b")
    y -= map_h
    if tokens:
        _draw_strip(fig, view, strip_title, strip_lines, width, height, y)
        y -= strip_h
    if view.topk:
        lines = ["top interactions (layer, head, query → key, value):"]
        qs = [f"{t['query_token']}({t['query']})" for t in view.topk]
        ks = [f"{t['key_token']}({t['key']})" for t in view.topk]
        wq, wk = max(map(len, qs)), max(map(len, ks))
        lines += [f"  L{t['layer']:<3} h{t['head']:<4} {q:>{wq}} → {k:<{wk}}  {t['value']:+.4g}"
                  for t, q, k in zip(view.topk, qs, ks)]
        for k, line in enumerate(lines):
            fig.text(0.25 / width, (y - 0.2 - 0.17 * k) / height, line, fontsize=8, family="DejaVu Sans Mono",
                     va="top", fontweight="bold" if k == 0 else "normal")
        y -= table_h
    if tree_png:
        ax = fig.add_axes((0.25 / width, (y - 0.3 - tree_h) / height, tree_w / width, tree_h / height))
        ax.imshow(tree_img, interpolation="antialiased")
        ax.set_axis_off()
    return fig


def _tick(token: str, pos: int, mode: str) -> str:
    return f"{token} {pos}" if mode == "window" else token


def _strip_layout(tokens, width_in: float) -> list[tuple[float, int]]:
    """(x inches, line) per token, wrapping at ``width_in`` (monospace estimate)."""
    out, x, line = [], 0.0, 0
    for t in tokens:
        w = 0.075 * max(len(str(t)), 1) + 0.14
        if x + w > width_in and x > 0:
            x, line = 0.0, line + 1
        out.append((x, line))
        x += w
    return out or [(0.0, 0)]


def _strip_title(view: View) -> str:
    imp = view.importance
    values = np.asarray(imp["values"], dtype=np.float64)
    top = float(np.max(np.abs(values))) if values.size else 0.0
    return f"token importance: {imp['description']} (green +, red −; max |v| {top:.3g})"


def _draw_strip(fig, view: View, title: list[str], layout, width: float, height: float, y: float) -> None:
    imp = view.importance
    values = np.asarray(imp["values"], dtype=np.float64)
    top = float(np.max(np.abs(values))) if values.size else 0.0
    for k, line in enumerate(title):
        fig.text(0.25 / width, (y - 0.1 - 0.17 * k) / height, line, fontsize=8.5, va="top", fontweight="bold")
    y -= 0.17 * (len(title) - 1)
    for t, v, (x, line) in zip(imp["tokens"], values, layout):
        fig.text((0.3 + x) / width, (y - 0.45 - 0.26 * line) / height, str(t), fontsize=8, family="DejaVu Sans Mono",
                 va="top", bbox=dict(boxstyle="round,pad=0.15", fc=token_rgb(v, top), ec="none"))


def figure_bytes(view: View, fmt: str, dpi: int = 150, tree_png: bytes | None = None) -> bytes:
    if fmt not in FIGURE_FORMATS:
        raise OptionError(f"cannot draw '{fmt}'; available: {', '.join(FIGURE_FORMATS)} (and html)")
    import matplotlib

    fig = view_figure(view, tree_png)
    if fmt == "png":  # bounded in pixels, whatever was asked for
        dpi = min(dpi, MAX_PIXELS / max(fig.get_size_inches()))
    buf = io.BytesIO()
    with matplotlib.rc_context({"svg.fonttype": "none"}):
        fig.savefig(buf, dpi=dpi, format=fmt)
    return buf.getvalue()
