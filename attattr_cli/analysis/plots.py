"""Pictures of head importance and pruning (matplotlib, PNG/SVG/PDF by the file's suffix). No printing."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import OptionError
from ..fileio import replaced

FORMATS = (".png", ".svg", ".pdf")


def new_figure(width: float, height: float, **kwargs):
    """A matplotlib Figure drawn off screen (Agg), made directly: no pyplot, so no GUI backend,
    no global state, nothing left open. A notebook shows it (``_repr_png_``)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
    except ImportError:
        raise OptionError("plots need matplotlib: pip install matplotlib") from None
    fig = _figure_class()(figsize=(width, height), **kwargs)
    FigureCanvasAgg(fig)
    return fig


@functools.cache
def _figure_class():
    """matplotlib's Figure with what a notebook and a caller want: ``_repr_png_`` (the
    picture, shown without pyplot's inline backend) and ``save(path)`` (.png, .svg, .pdf by the
    suffix, whole or not at all). Made on first use: matplotlib loads only when a plot is drawn."""
    from matplotlib.figure import Figure

    class PlotFigure(Figure):
        def _repr_png_(self) -> bytes:
            import io

            buf = io.BytesIO()
            self.savefig(buf, format="png", dpi=100, bbox_inches="tight")
            return compact_png(buf.getvalue())

        def _ipython_display_(self) -> None:
            # shown as _repr_png_ says (the compact PNG), not by the inline backend's own
            # printer for every Figure, which would store the full-colour picture
            from IPython.display import display

            display({"image/png": self._repr_png_(), "text/plain": f"<{type(self).__name__}>"}, raw=True)

        def save(self, path) -> Path:
            """Write the figure to ``path`` (.png, .svg or .pdf), whole or not at all."""
            _save(self, path)
            return Path(path)

    return PlotFigure


def compact_png(data: bytes) -> bytes:
    """A PNG for a notebook: the same picture on a palette of 256 colours (plots and views use
    far fewer; about a third of the bytes), or ``data`` as it is where that is not smaller or
    Pillow is missing. Files written with ``save``/``out`` keep their full colours."""
    import io

    try:
        from PIL import Image
    except ImportError:
        return data
    im = Image.open(io.BytesIO(data)).convert("RGB")
    buf = io.BytesIO()
    im.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE).save(buf, format="png", optimize=True)
    return buf.getvalue() if buf.tell() < len(data) else data


def _save(fig, path: str | Path) -> None:
    path = Path(path)
    if path.suffix.lower() not in FORMATS:
        raise OptionError(f"--plot {path}: use a .png, .svg or .pdf file name")
    with replaced(path, suffix=path.suffix) as tmp:
        fig.savefig(tmp, dpi=150, bbox_inches="tight")


def _style(name: str) -> tuple[str, str | None, int]:
    """A table's label, colour and place in plots: the importance registry's, else its name,
    matplotlib's next colour, after the registered tables."""
    from .importance import TABLES

    m = TABLES.get(name)
    return (m.label, m.color, list(TABLES).index(name)) if m else (name, None, len(TABLES))


_LOCAL = re.compile(r"^(?:/|~[\\/]|[A-Za-z]:[\\/])")


def short_title(title: str) -> str:
    """A title without local paths: each word that is an absolute path becomes its last part
    (``/home/x/models/sst2-minilm on sst2`` -> ``sst2-minilm on sst2``); hub ids stay."""
    def short(word: str) -> str:
        if not _LOCAL.match(word):
            return word
        parts = [p for p in re.split(r"[\\/]", word) if p]
        return parts[-1] if parts else word

    return re.sub(r"\S+", lambda m: short(m.group(0)), title or "")


def _table_title(t) -> str:
    if t.method == "random" and getattr(t, "seed", None) is not None:
        return f"random (seed {t.seed})"
    return _style(t.name)[0]


def importance_figure(tables: Sequence, title: str = "", columns: int = 4):
    """The figure of :func:`importance_heatmaps`: a matplotlib Figure (the caller saves it)."""
    tables = sorted(tables, key=lambda t: (_style(t.method)[2], t.method, getattr(t, "seed", None) or 0, t.name))
    n = max(len(tables), 1)
    cols = min(n, columns)
    rows = -(-n // cols)
    L, H = tables[0].values.shape if tables else (1, 1)
    panel_w, panel_h = max(2.2, 0.42 * H + 1.6), max(1.8, 0.32 * L + 1.2)
    fig = new_figure(panel_w * cols, panel_h * rows + (0.35 if title else 0), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, t in zip(axes.flat, tables):
        im = ax.imshow(t.values, aspect="auto", cmap="viridis", interpolation="nearest")
        ax.set_title(_table_title(t), fontsize=10)
        ax.set_xlabel("head", fontsize=8)
        ax.set_ylabel("layer", fontsize=8)
        ax.set_xticks(range(H))
        ax.set_yticks(range(L))
        ax.tick_params(labelsize=7)
        bar = fig.colorbar(im, ax=ax, shrink=0.9, aspect=15, pad=0.02)
        bar.ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(tables):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(short_title(title), fontsize=10)
    return fig


def importance_heatmaps(tables: Sequence, path: str | Path, title: str = "") -> None:
    """One heatmap per table (layers x heads), each with its own colour bar, at most four to a
    row; every random table is drawn (one per seed). Local paths in ``title`` are shortened."""
    _save(importance_figure(tables, title), path)


def _curves_panel(ax, curves: dict) -> None:
    rates = np.asarray(curves["rates"]) * 100
    metric = curves["metric"]
    banded = False
    for name, entry in curves["methods"].items():
        y = np.asarray(entry[metric])
        color = _style(entry.get("method", name))[1]
        label = _style(name)[0]
        if "tables" in entry:
            label += f" (mean of {len(entry['tables'])})"
        if "accuracy" not in curves["baseline"]:  # a language-model pair task: its metric's band
            banded |= _band(ax, rates, entry, color, metric)
        elif metric == "accuracy":
            banded |= _band(ax, rates, entry, color)
            if not banded and "accuracy_std" in entry:  # a result written before the bands: ± sd of the orders
                sd = np.asarray(entry["accuracy_std"])
                ax.fill_between(rates, y - sd, y + sd, color=color, alpha=0.15, linewidth=0)
        ax.plot(rates, y, marker="o", markersize=3, label=label, color=color)
    ax.axhline(curves["baseline"][metric], color="black", linestyle=":", linewidth=1, label="unpruned")
    ax.set_xlabel("heads pruned (%)")
    ax.set_ylabel(metric)
    ax.set_xticks(rates)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"pruning curves ({curves['n_examples']} examples)"
                 + (f"; shaded: {curves.get('level', 0.95):.0%} bootstrap interval" if banded else ""), fontsize=10)


def _band(ax, x, entry: dict, color, metric: str = "accuracy") -> bool:
    """Shade an entry's bootstrap interval (``accuracy_low``/``accuracy_high``, or another
    metric's) where it has one."""
    lo, hi = entry.get(f"{metric}_low"), entry.get(f"{metric}_high")
    if not lo or not hi or any(v is None for v in (*lo, *hi)):
        return False
    ax.fill_between(x, lo, hi, color=color, alpha=0.15, linewidth=0)
    return True


def _effectiveness_panel(ax, eff: dict) -> None:
    ks = eff["ks"]
    styles = {
        "attr_small_first": ("tab:blue", "-"), "attr_large_first": ("tab:blue", "--"),
        "attention_small_first": ("tab:red", "-"), "attention_large_first": ("tab:red", "--"),
    }
    banded = False
    orders = list(eff["orders"].items())
    for j, (name, entry) in enumerate(orders):
        color, ls = styles.get(name, (None, "-"))
        y = np.asarray(entry["accuracy"], dtype=float)
        lo, hi = entry.get("accuracy_low"), entry.get("accuracy_high")
        if lo and hi and not any(v is None for v in (*lo, *hi)):
            # four overlapping bands would hide each other: intervals as bars, side by side
            x = np.asarray(ks, dtype=float) + 0.12 * (j - (len(orders) - 1) / 2)
            ax.errorbar(x, y, yerr=[y - np.asarray(lo), np.asarray(hi) - y], fmt="none", ecolor=color,
                        elinewidth=1, capsize=2, alpha=0.6)
            banded = True
        ax.plot(ks, y, marker="o", markersize=3, color=color, linestyle=ls, label=name.replace("_", " "))
    ax.axhline(eff["baseline_accuracy"], color="black", linestyle=":", linewidth=1, label="unpruned")
    ax.set_xlabel("heads pruned per layer (per example)")
    ax.set_ylabel("accuracy (mean over layers)")
    ax.set_xticks(ks)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(f"effectiveness ({eff['n_examples']} examples)"
                 + (f"; bars: {eff.get('level', 0.95):.0%} bootstrap interval" if banded else ""), fontsize=10)


def prune_plot(result: dict, title: str = ""):
    """The curves and/or the effectiveness analysis of a CURVES.json result, side by side, as
    a matplotlib Figure."""
    panels = [k for k in ("curves", "effectiveness") if result.get(k)]
    fig = new_figure(6.0 * max(len(panels), 1), 4.2)
    axes = fig.subplots(1, max(len(panels), 1), squeeze=False)
    for ax, key in zip(axes[0], panels):
        (_curves_panel if key == "curves" else _effectiveness_panel)(ax, result[key])
    if title:
        fig.suptitle(short_title(title), fontsize=10)
    return fig
