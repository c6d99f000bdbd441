"""The step x source view of a generation (docs/views.md): rows the generated tokens (or
words), columns the prompt and the earlier generated tokens (or words), each cell the step's
token importance of the column (its attribution summed over layers, heads and queries;
analysis/aggregate.py ``step_source``). PNG, SVG, PDF (matplotlib) or HTML (the SVG and a
table of the steps, offline). With ``per_layer`` one panel per layer follows the total.
"""

from __future__ import annotations

import html as html_mod
import io
from dataclasses import dataclass, field

import numpy as np

from ..analysis.aggregate import word_style, step_source, word_text
from .figure import ATTR_CMAP, MASKED


def shown(text: str) -> str:
    """A label as drawn: line breaks and tabs visible, an empty one as the open-box sign."""
    return text.replace("\n", "⏎").replace("\t", "⇥") or "␣"


@dataclass
class StepView:
    rows: list[str]
    columns: list[str]
    matrix: np.ndarray
    f_rows: np.ndarray
    words: bool
    layers: list[int] = field(default_factory=list)
    header: list[str] = field(default_factory=list)


def step_view(example, words: bool = True) -> tuple[StepView, np.ndarray]:
    matrix, rows, cols, f_rows, by_layer = step_source(example, words=words)
    lm = example.meta.get("lm", {})
    prompt_n = len(example.tokens) - len(example.steps) + 1
    prompt = word_text(list(example.tokens[:prompt_n]))
    generated = word_text([st.meta["step"]["target_token"] for st in example.steps])
    what = {"prob": "p", "logprob": "log p", "logit": "logit"}.get(lm.get("output", "prob"), "F")
    foil = lm.get("foil_token")
    target = f"{what}(token){' - ' + what + '(' + word_text([foil]) + ')' if foil else ''}"
    resid = max(float(np.abs(st.residual).max()) for st in example.steps)
    bad = [(t, layer, why) for t, st in enumerate(example.steps) for layer, why in st.unconverged_layers.items()]
    header = [f"example {example.index} · {len(example.steps)} steps"
              f" ({'generated' if lm.get('generated') else 'given'}{', sampled' if lm.get('sampled') else ''})"
              f" · target per step: {target} given everything before it",
              f"prompt: {prompt[:120]}", f"generated: {generated[:120]}",
              f"largest |completeness residual| of a step and layer: {resid:.2e}"
              + (f" · NOT CONVERGED at {len(bad)} step-layers" if bad else " · every step-layer converged")]
    return StepView([shown(r) for r in rows], [shown(c) for c in cols], matrix, f_rows, words,
                    list(example.steps[0].layers), [shown(h) for h in header]), by_layer


def step_figure(view: StepView, by_layer: np.ndarray | None = None):
    """The step x source matrix (and one panel per layer with ``by_layer``): a matplotlib
    ``Figure`` made directly (no pyplot)."""
    import matplotlib
    from matplotlib.colors import TwoSlopeNorm

    from .notebook import new_figure

    panels = [("all layers", view.matrix)] + ([(f"layer {layer}", by_layer[i]) for i, layer in enumerate(view.layers)]
                                             if by_layer is not None else [])
    nr, nc = view.matrix.shape
    w = max(4.0, 0.45 * nc + 2.5)
    h = max(2.0, 0.4 * nr + 1.6)
    cols = min(len(panels), 4)
    grid_rows = 1 + (len(panels) - 1 + cols - 1) // cols if len(panels) > 1 else 1
    fig = new_figure(w * (1 if len(panels) == 1 else cols * 0.8), h * grid_rows + 1.2)
    fig.text(0.01, 0.99, "\n".join(view.header), va="top", ha="left", fontsize=8, family="monospace")
    cmap = matplotlib.colormaps.get_cmap(ATTR_CMAP).with_extremes(bad=MASKED)
    top = 0.82 if grid_rows == 1 else 0.9
    for k, (name, m) in enumerate(panels):
        if len(panels) == 1:
            ax = fig.add_axes([0.18, 0.22, 0.7, top - 0.3])
        else:
            ax = fig.add_subplot(grid_rows, cols, 1 if k == 0 else cols + k)
        big = float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 1.0
        big = big or 1.0
        im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=TwoSlopeNorm(0.0, -big, big), aspect="auto")
        ax.set_xticks(range(nc))
        ax.set_xticklabels(view.columns, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(nr))
        ax.set_yticklabels([f"{r!s} ({f:.3g})" for r, f in zip(view.rows, view.f_rows)], fontsize=8)
        ax.set_title(f"{name}: generated {'words' if view.words else 'tokens'} (rows, F) x sources", fontsize=9)
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="attribution (summed)")
    return fig


def _figure_bytes(view: StepView, by_layer, fmt: str) -> bytes:
    fig = step_figure(view, by_layer)
    buf = io.BytesIO()
    fig.savefig(buf, format=fmt, dpi=130, bbox_inches="tight")
    return buf.getvalue()


def _svg(view: StepView, by_layer) -> str:
    svg = _figure_bytes(view, by_layer, "svg").decode("utf-8")
    return svg[svg.find("<svg"):]


def _step_details(t: int, st, style: str) -> str:
    """One step's strongest interactions, opened by a click (HTML)."""
    try:
        top = st.top(8)
    except Exception:  # a step kept without maps or top-k: nothing to list
        return ""
    cells = "".join(f"<tr><td>{r.layer}</td><td>{'sum' if r.head < 0 else r.head}</td>"
                    f"<td>{html_mod.escape(shown(word_text([r.query_token], style)))} ({r.query})</td>"
                    f"<td>{html_mod.escape(shown(word_text([r.key_token], style)))} ({r.key})</td><td>{r.value:.3g}</td></tr>" for r in top)
    return (f"<details><summary>step {t}: the strongest interactions</summary><table><tr><th>layer</th><th>head</th>"
            f"<th>query</th><th>key</th><th>attribution</th></tr>{cells}</table></details>")


def step_bytes(example, fmt: str, words: bool = True, per_layer: bool = False,
               title: str = "attattr view") -> tuple[bytes, StepView]:
    view, by_layer = step_view(example, words)
    if fmt != "html":
        return _figure_bytes(view, by_layer if per_layer else None, fmt), view
    style = word_style(list(example.tokens))
    svg = _svg(view, None)
    layers_svg = _svg(view, by_layer)
    rows = "".join(
        f"<tr><td>{t}</td><td>{html_mod.escape(shown(word_text([st.meta['step']['target_token']])))}</td><td>{st.f_full:.4g}</td>"
        f"<td>{float(np.abs(st.residual).max()):.2e}</td><td>{'yes' if st.converged else 'NO'}</td>"
        f"<td>{_step_details(t, st, style)}</td></tr>"
        for t, st in enumerate(example.steps))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html_mod.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
            "</style></head><body>"
            f"<h1>{html_mod.escape(title)}</h1>" + "".join(f"<p>{html_mod.escape(x)}</p>" for x in view.header)
            + svg + "<details><summary>per layer</summary>" + layers_svg + "</details>"
            "<h2>Steps</h2><table><tr><th>step</th><th>token</th><th>F</th>"
            "<th>max |residual|</th><th>converged</th><th></th></tr>" + rows + "</table></body></html>")
    return page.encode("utf-8"), view
