"""The step x source view of a generation (docs/views.md, "A generation: the step × source
matrix"; the matrix is analysis/aggregate.py ``step_source``): PNG, SVG, PDF (matplotlib), an
HTML page, and the still picture a notebook and the report show.
"""

from __future__ import annotations

import dataclasses
import html as html_mod
import io
from dataclasses import dataclass, field

import numpy as np

from ..analysis.aggregate import step_source, word_style, word_text
from ..errors import OptionError
from ..labels import example_labels, visible as shown
from .data import format_number, lm_meta
from .figure import ATTR_CMAP, MASKED
from .still import FONT


@dataclass
class StepView:
    rows: list[str]
    columns: list[str]
    matrix: np.ndarray
    f_rows: np.ndarray
    words: bool
    layers: list[int] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    row_sums: np.ndarray | None = None  # what each row's cells add to: the sum over every layer

    @property
    def sum_note(self) -> str:
        """What a row's F and its cells' sum are, written beside the matrix."""
        n = len(self.layers)
        return (f"a row's label gives its F and the sum of its cells (Σ); each layer's cells add up to F − F(that"
                f" layer's attention at 0), so a row adds up {n} layers' totals, not F")


def facts(example) -> dict:
    """What every display of a generation says of it (the view's header, the report's row, the
    notebook): the prompt and generated text (words), the generated tokens, the target per step,
    the foil, how the steps came (generated, sampled, given), the largest |completeness
    residual| of a step and layer and the step-layers whose integral did not converge."""
    lm = lm_meta(example) or {}
    steps = list(example.steps)
    prompt_n = len(example.tokens) - len(steps) + 1
    pieces = [str(st.meta["step"]["target_token"]) for st in steps]
    full = [str(t) for t in example.tokens] + pieces[-1:]
    labels = example_labels(dataclasses.replace(example, tokens=full, key_tokens=None, steps=None))[0]
    tokens = labels[prompt_n:prompt_n + len(steps)]  # each generated token's label, decoded in its sequence
    what = {"prob": "p", "logprob": "log p", "logit": "logit"}.get(lm.get("output", "prob"), "F")
    foil = lm.get("foil_token")
    foil_text = None if foil is None else getattr(example, "foil_label", None) or str(foil)
    resid = [float(np.abs(np.asarray(st.residual, np.float64)).max()) for st in steps if np.size(st.residual)]
    style = word_style(full)  # words without markers (a word-level tokenizer) are spaced, as they are read
    return {"prompt": word_text(full[:prompt_n], style), "generated": shown(word_text(pieces, style)), "tokens": tokens,
            "pieces": pieces, "steps": len(steps), "foil": foil_text,
            "target": f"{what}(token)" + (f" - {what}({foil_text})" if foil is not None else ""),
            "how": ("generated" if lm.get("generated") else "given") + (", sampled" if lm.get("sampled") else ""),
            "max_residual": max(resid) if resid else None,
            "unconverged": [(t, layer, why) for t, st in enumerate(steps) for layer, why in st.unconverged_layers.items()]}


STEP_COLUMNS = ["example", "step", "position", "token", "piece", "target_value", "probability", "foil",
                "foil_probability", "max_abs_residual", "converged", "unconverged_layers"]


def step_rows(example) -> list[dict]:
    """One row per step of a generation, keyed by ``STEP_COLUMNS``: ``token`` as a reader sees it
    (labels.py), ``piece`` as the tokenizer wrote it, ``target_value`` the attributed F (minus
    the foil's with a foil), ``foil``/``foil_probability`` None without one, ``unconverged_layers``
    as ``"L0 (why), ..."``."""
    f = facts(example)
    foil_probs = list((lm_meta(example) or {}).get("foil_probs") or []) if f["foil"] is not None else []
    rows = []
    for t, st in enumerate(example.steps):
        s = st.meta["step"]
        resid = np.abs(np.asarray(st.residual, np.float64))
        bad = st.unconverged_layers
        rows.append({"example": int(example.index), "step": t, "position": int(s["position"]),
                     "token": f["tokens"][t], "piece": str(s["target_token"]), "target_value": float(st.f_full),
                     "probability": float(s["prob"]), "foil": f["foil"],
                     "foil_probability": float(foil_probs[t]) if t < len(foil_probs) else None,
                     "max_abs_residual": float(resid.max()) if resid.size else None, "converged": not bad,
                     "unconverged_layers": ", ".join(f"L{layer} ({why})" for layer, why in bad.items())})
    return rows


def step_view(example, words: bool = True) -> tuple[StepView, np.ndarray]:
    matrix, rows, cols, f_rows, by_layer = step_source(example, words=words)
    f = facts(example)
    resid, bad = f["max_residual"] or 0.0, f["unconverged"]
    header = [f"example {example.index} · {f['steps']} steps ({f['how']})"
              f" · target per step: {f['target']} given everything before it",
              f"prompt: {f['prompt'][:120]}", f"generated: {f['generated'].strip()[:120]}",
              f"largest |completeness residual| of a step and layer: {resid:.2e}"
              + (f" · NOT CONVERGED at {len(bad)} step-layers" if bad else " · every step-layer converged")]
    view = StepView([shown(r) for r in rows], [shown(c) for c in cols], matrix, f_rows, words,
                    list(example.steps[0].layers), [shown(h) for h in header], np.nansum(matrix, axis=1))
    view.header.append(view.sum_note)
    return view, by_layer


def row_label(row: str, f=None, total=None) -> str:
    """A matrix row's label: ``␣Paris (F 0.773, Σ 5.07)``: its F and what its cells add to."""
    if f is None:
        return str(row)
    return f"{row} (F {format_number(f)}" + ("" if total is None else f", Σ {format_number(total)}") + ")"


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
        big = (float(np.nanmax(np.abs(m))) if np.isfinite(m).any() else 0.0) or 1.0
        im = ax.imshow(np.ma.masked_invalid(m), cmap=cmap, norm=TwoSlopeNorm(0.0, -big, big), aspect="auto")
        ax.set_xticks(range(nc))
        ax.set_xticklabels(view.columns, rotation=60, ha="right", fontsize=8)
        ax.set_yticks(range(nr))
        ax.set_yticklabels([row_label(r, f, s) for r, f, s in zip(view.rows, view.f_rows, np.nansum(m, axis=1))],
                           fontsize=8)
        ax.set_title(f"{name}: generated {'words' if view.words else 'tokens'} (rows: F, Σ of the row) x sources",
                     fontsize=9)
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


def _step_details(t: int, st) -> str:
    """One step's strongest interactions, opened by a click (HTML)."""
    try:
        top = st.top(8)
    except Exception:  # a step kept without maps or top-k: nothing to list
        return ""
    cells = "".join(f"<tr><td>{r.layer}</td><td>{'sum' if r.head < 0 else r.head}</td>"
                    f"<td>{html_mod.escape(r.query_token)} ({r.query})</td>"
                    f"<td>{html_mod.escape(r.key_token)} ({r.key})</td><td>{r.value:.3g}</td></tr>" for r in top)
    return (f"<details><summary>step {t}: the strongest interactions</summary><table><tr><th>layer</th><th>head</th>"
            f"<th>query</th><th>key</th><th>attribution</th></tr>{cells}</table></details>")


def step_bytes(example, fmt: str, words: bool = True, per_layer: bool = False,
               title: str = "attattr view") -> tuple[bytes, StepView]:
    view, by_layer = step_view(example, words)
    if fmt != "html":
        return _figure_bytes(view, by_layer if per_layer else None, fmt), view
    svg = _svg(view, None)
    layers_svg = _svg(view, by_layer)
    rows = "".join(
        f"<tr><td>{r['step']}</td><td title='{html_mod.escape(r['piece'], quote=True)}'>{html_mod.escape(r['token'])}</td>"
        f"<td>{r['target_value']:.4g}</td><td>{r['probability']:.3g}</td>"
        f"<td>{float(np.abs(st.residual).max()):.2e}</td><td>{'yes' if st.converged else 'NO'}</td>"
        f"<td>{_step_details(r['step'], st)}</td></tr>"
        for r, st in zip(step_rows(example), example.steps))
    page = (f"<!doctype html><html><head><meta charset='utf-8'><title>{html_mod.escape(title)}</title>"
            "<style>body{font-family:sans-serif;margin:1em}td,th{padding:2px 8px;border-bottom:1px solid #ddd}"
            "</style></head><body>"
            f"<h1>{html_mod.escape(title)}</h1>" + "".join(f"<p>{html_mod.escape(x)}</p>" for x in view.header)
            + svg + "<details><summary>per layer</summary>" + layers_svg + "</details>"
            "<h2>Steps</h2><table><tr><th>step</th><th>token</th><th>F</th><th>p(token)</th>"
            "<th>max |residual|</th><th>converged</th><th></th></tr>" + rows + "</table></body></html>")
    return page.encode("utf-8"), view


# -- the still picture: the notebook's display and the report's example, no script ----------------
TIP_CELLS = 2000  # a matrix of more cells is drawn as still.py's heatmaps are (runs of a colour, no value on hover)
LAYER_CELLS = 5000  # the per-layer matrices of a still picture, in all; more: a note names plot(per_layer=True)


def matrix_svg(rows, cols, matrix, caption: str, row_values=None, tips: bool = True, row_sums: bool = True) -> str:
    """A step x source matrix as an SVG (still.py's colours and sizes): one ``<rect>`` per cell
    with its value in a ``<title>`` (the browser shows it on hover, no script), cells outside a
    step's prefix in the masked colour, key labels on top, ``token (F, Σ)`` labels on the left
    (``row_values`` the rows' F; with ``row_sums`` also what the row's cells add to).
    Without ``tips``, or above ``TIP_CELLS`` cells, still.py's compact heatmap (one path per
    colour step, no values on hover)."""
    from .still import MASKED, cell_colour, cut_label, heatmap_svg, svg_frame

    m = np.asarray(matrix, np.float64)
    nr, nc = m.shape
    finite = np.abs(m[np.isfinite(m)])
    top = float(finite.max()) if finite.size and finite.max() > 0 else 1.0
    sums = np.nansum(m, axis=1) if row_sums else [None] * nr
    full_rows = [row_label(cut_label(str(r)), None if row_values is None else v, s)
                 for r, v, s in zip(rows, row_values if row_values is not None else rows, sums)]
    if not tips or m.size > TIP_CELLS:
        return heatmap_svg(np.nan_to_num(m), "attr", top, full_rows, [str(c) for c in cols], caption, np.isnan(m),
                           cls="aa-step-matrix", cut_rows=False)
    cell = max(10, min(22, 520 // max(nc, 1)))
    out, ox, oy = svg_frame("attr", top, full_rows, [cut_label(str(c)) for c in cols], caption, cell, "aa-step-matrix")
    out.append('</g><g shape-rendering="crispEdges">')
    for i in range(nr):
        for j in range(nc):
            v = float(m[i, j])
            fill = MASKED if not np.isfinite(v) else cell_colour("attr", v, top)
            tip = f"{rows[i]} ← {cols[j]}: " + (format_number(v, signed=True) if np.isfinite(v) else "not in the step's prefix")
            out.append(f'<rect x="{ox + j * cell}" y="{oy + i * cell}" width="{cell}" height="{cell}" fill="{fill}">'
                       f"<title>{html_mod.escape(tip)}</title></rect>")
    out.append("</g></svg>")
    return "".join(out)


def _matrices(example, view: StepView, by_layer, words: bool, per_layer: bool) -> str:
    """The still picture's matrices: over words (or tokens), the other grouping behind a click
    where it differs, and one per layer behind a click (up to ``LAYER_CELLS``; else a note)."""
    def caption(kind):
        return (f"step x source, all {len(view.layers)} layers: generated {kind} (rows: F, Σ of the row) x the {kind}"
                " before them; token importance")

    kind, okind = ("words", "tokens") if words else ("tokens", "words")
    out = ['<div style="margin:8px 0">' + matrix_svg(view.rows, view.columns, view.matrix, caption(kind), view.f_rows)
           + f'<div style="color:#555;font-size:11px">{html_mod.escape(view.sum_note)}</div></div>']
    other = step_view(example, not words)[0]
    if other.rows != view.rows or other.columns != view.columns:
        out.append(f"<details><summary>the same over {okind}</summary>"
                   + matrix_svg(other.rows, other.columns, other.matrix, caption(okind), other.f_rows) + "</details>")
    if per_layer and len(view.layers) > 1 and by_layer.size <= LAYER_CELLS:
        out.append('<details><summary>per layer</summary><div style="display:flex;flex-wrap:wrap;gap:10px">'
                   + "".join(matrix_svg(view.rows, view.columns, by_layer[k], f"layer {layer}", view.f_rows, tips=False)
                             for k, layer in enumerate(view.layers)) + "</div></details>")
    elif per_layer and len(view.layers) > 1:
        out.append(f'<div style="margin:2px 0;color:#777;font-size:11px">per layer ({len(view.layers)} matrices):'
                   " plot(per_layer=True), or attattr view --per-layer</div>")
    return "".join(out)


def step_still(example, words: bool = True, per_layer: bool = True, details: bool = True) -> str:
    """A generation as HTML without script (inline styles and SVG only; docs/views.md, "A
    generation"): the notebook's display and the report's view of it. ``per_layer``: one matrix
    per layer behind a click; ``details``: each step's strongest interactions behind a click."""
    e = html_mod.escape
    f = facts(example)
    try:
        view, by_layer = step_view(example, words)
    except OptionError as exc:  # kept without maps or head sums (keep none): the text and the steps
        view, by_layer, missing = None, None, str(exc)
    parts = [f'<div class="aa-steps" style="font:13px/1.4 {FONT};color:#1d1d1d">',
             f'<div style="font-size:15px;font-weight:600;margin:4px 0 6px">example {example.index} · generation of'
             f' {f["steps"]} steps ({e(f["how"])})</div>',
             f'<div style="margin:2px 0"><b>prompt:</b> <span style="color:#555">{e(f["prompt"])}</span></div>',
             f'<div style="margin:2px 0" class="aa-generated"><b>generated:</b> <span style="font-weight:600">'
             f'{e(f["generated"])}</span></div>',
             f'<div style="margin:2px 0">target per step: {e(f["target"])} given everything before it'
             + (f' · <b>foil</b> {e(f["foil"])}' if f["foil"] is not None else "") + "</div>"]
    bad = f["unconverged"]
    parts.append(f'<div style="margin:2px 0">largest |completeness residual| of a step and layer: '
                 f'{f["max_residual"] or 0.0:.2e}'
                 + (f'<span style="color:#b30000;font-weight:600"> · not converged at {len(bad)} step-layers</span>'
                    if bad else " · every step-layer converged") + "</div>")
    if view is None:
        parts.append(f'<div style="margin:8px 0;color:#555">no step x source matrix: {e(missing)}</div>')
    else:
        parts.append(_matrices(example, view, by_layer, words, per_layer))
    td = 'style="padding:2px 8px;border-bottom:1px solid #e6e6e6;text-align:left;vertical-align:top"'
    heads = ["step", "token", "F", "p(token)"] + (["p(foil)"] if f["foil"] is not None else []) + \
        ["max |residual|", "converged", ""]
    rows = []
    for r, st in zip(step_rows(example), example.steps):
        cells = [r["step"], r["token"], f"{r['target_value']:.4g}", f"{r['probability']:.3g}"]
        if f["foil"] is not None:
            cells.append("" if r["foil_probability"] is None else f"{r['foil_probability']:.3g}")
        cells += ["n/a" if r["max_abs_residual"] is None else f"{r['max_abs_residual']:.2e}",
                  "yes" if r["converged"] else f"NO: {r['unconverged_layers']}"]
        rows.append("<tr>" + "".join(f"<td {td}>{e(str(c))}</td>" for c in cells)
                    + f"<td {td}>{_step_details(r['step'], st) if details else ''}</td></tr>")
    parts.append('<table class="aa-step-table" style="border-collapse:collapse;font-size:12px;margin:6px 0">'
                 "<tr>" + "".join(f"<th {td}>{e(h)}</th>" for h in heads) + "</tr>" + "".join(rows) + "</table>")
    parts.append("</div>")
    return "".join(parts)
