"""The still picture inside every HTML view: what a page shows before (or without) its script
``static/view.js`` (docs/views.md, "Every HTML view also works without JavaScript"). Inline
styles and SVG attributes only: a stylesheet can be stripped (GitHub does), these cannot.
numpy only, no printing.
"""

from __future__ import annotations

import html
from typing import Sequence

import numpy as np

from ..errors import OptionError
from .colours import cell_colour, token_colour
from .data import format_number, unpack

MASKED = "#e6dcc6"  # view.js hatches masked cells; one flat tan here
KIND = {"attr": "attribution", "attention": "attention"}
FONT = "system-ui,-apple-system,'Segoe UI',Helvetica,Arial,sans-serif"
LABEL_CHARS = 18  # longer axis labels are cut with …


def shared_scale(maps: np.ndarray, heads: Sequence[str], head: int, masked) -> float:
    """view.js's scaleOf: the largest |value| over every layer, over the head sums or over the
    single heads (whichever ``head`` is), masked cells left out; 1 when all are zero."""
    single = heads[head] != "sum"
    pick = [h for h, name in enumerate(heads) if (name != "sum") == single]
    a = np.abs(np.asarray(maps, dtype=np.float64)[:, pick])
    if masked is not None:
        a = np.where(np.asarray(masked, bool)[None, None], 0.0, a)
    a = np.where(np.isfinite(a), a, 0.0)
    top = float(a.max()) if a.size else 0.0
    return top or 1.0


def cut_label(s: str) -> str:
    return s if len(s) <= LABEL_CHARS else s[:LABEL_CHARS - 1] + "…"


def text_width(s: str, size: float) -> float:
    return len(s) * size * 0.62


# -- one heatmap ---------------------------------------------------------------------------------
def svg_frame(kind: str, top: float, rows: Sequence[str], cols: Sequence[str], caption: str, cell: int,
              cls: str, row_tips: Sequence[str] | None = None,
              col_tips: Sequence[str] | None = None) -> tuple[list[str], int, int]:
    """The parts of a map's SVG around its cells (``rows`` and ``cols`` as shown): the opening
    tag, the caption and a colour bar above, key labels on top (vertical), query labels on the
    left; with the cells' origin ``(ox, oy)``."""
    fs = min(11, cell - 1)
    left = int(max([text_width(r, fs) for r in rows] + [0])) + 6
    head = int(max([text_width(c, fs) for c in cols] + [0])) + 6
    ox, oy = left, 30 + head  # 30: the caption and the colour bar
    width = int(max(ox + len(cols) * cell + 2, text_width(caption, 11) + 4, 240))  # the caption and the colour bar fit
    height = oy + len(rows) * cell + 2
    low = ("−" + format_number(top)) if kind == "attr" else "0"
    bar = int(text_width(low, 10)) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="{cls}" data-kind="{kind}" width="{width}" '
           f'height="{height}" viewBox="0 0 {width} {height}" font-family="{FONT}" style="display:block">',
           f'<text x="0" y="11" font-size="11" fill="#333">{html.escape(caption)}</text>',
           f'<text x="0" y="24" font-size="10" fill="#333">{html.escape(low)}</text>']
    stops = 16  # the colour bar: -top .. top (attribution) or 0 .. top (attention)
    for s in range(stops):
        f = s / (stops - 1)
        v = (2 * f - 1) * top if kind == "attr" else f * top
        out.append(f'<rect x="{bar + s * 8}" y="16" width="8" height="9" fill="{cell_colour(kind, v, top)}"/>')
    out.append(f'<text x="{bar + 4 + stops * 8}" y="24" font-size="10" fill="#333">{html.escape(format_number(top))}</text>')
    out.append(f'<g font-size="{fs}" fill="#222" transform="rotate(-90)">')  # key labels, read bottom to top
    out.extend(f'<text x="{3 - oy}" y="{ox + j * cell + cell / 2 + fs / 3:g}">{html.escape(c)}{_tip(col_tips, j, c)}</text>'
               for j, c in enumerate(cols))
    out.append(f'</g><g font-size="{fs}" fill="#222" text-anchor="end">')
    out.extend(f'<text x="{ox - 4}" y="{oy + i * cell + cell / 2 + fs / 3:g}">{html.escape(r)}{_tip(row_tips, i, r)}</text>'
               for i, r in enumerate(rows))
    return out, ox, oy


def heatmap_svg(m: np.ndarray, kind: str, top: float, rows: Sequence[str], cols: Sequence[str],
                caption: str, masked=None, cls: str = "aa-still-map", cut_rows: bool = True,
                row_tips: Sequence[str] | None = None, col_tips: Sequence[str] | None = None) -> str:
    """One [query, key] map as an SVG (:func:`svg_frame`; query labels cut to ``LABEL_CHARS``
    unless ``cut_rows`` is False; ``row_tips``/``col_tips``, a label's hover text: the
    tokenizer's piece), one ``<path>`` per colour step (runs of equal cells merged), drawn at
    view.js's cell size."""
    nq, nk = len(rows), len(cols)
    cell = max(9, min(22, 420 // max(nk, 1)))
    rows, cols = [cut_label(str(r)) if cut_rows else str(r) for r in rows], [cut_label(str(c)) for c in cols]
    paths: dict[str, list[str]] = {}  # colour -> runs of equal cells, each a stroke through a row's middle
    for i in range(nq):
        j = 0
        while j < nk:
            colour = MASKED if masked is not None and masked[i][j] else cell_colour(kind, float(m[i][j]), top)
            run = 1
            while j + run < nk and (MASKED if masked is not None and masked[i][j + run]
                                    else cell_colour(kind, float(m[i][j + run]), top)) == colour:
                run += 1
            paths.setdefault(colour, []).append(f"M{j} {i}.5h{run}")
            j += run
    out, ox, oy = svg_frame(kind, top, rows, cols, caption, cell, cls, row_tips, col_tips)
    out.append(f'</g><g transform="translate({ox} {oy}) scale({cell})" fill="none" stroke-width="1" '
               'shape-rendering="crispEdges">')
    out.extend(f'<path stroke="{c}" d="{"".join(p)}"/>' for c, p in paths.items())
    out.append("</g></svg>")
    return "".join(out)


def _tip(tips: Sequence[str] | None, i: int, label: str) -> str:
    """A label's hover text: the tokenizer's piece, where it differs from the label."""
    if not tips or i >= len(tips) or label.startswith(str(tips[i])):
        return ""
    return f"<title>{html.escape(f'piece: {tips[i]}')}</title>"


# -- the view ------------------------------------------------------------------------------------
def _div(body: str, style: str = "") -> str:
    return f'<div style="margin:2px 0;{style}">{body}</div>'


def header_html(data: dict) -> str:
    h = data["header"]
    e = html.escape
    title = f"example {h['index']}" + (f" · family {data['family']}" if data.get("family") not in (None, "self") else "")
    text = h["text_a"] + (f"  ‖  {h['text_b']}" if h.get("text_b") is not None else "")
    flags = "".join(f'<span style="color:#b30000;font-weight:600">  {w}</span>'
                    for w, on in (("wrong", h.get("correct") is False), ("truncated", h.get("truncated"))) if on)
    resid = ", ".join(f"L{l} {format_number(v, signed=True)}" for l, v in (h.get("residual") or {}).items())
    bad = ", ".join(f"L{l} ({why})" for l, why in (h.get("unconverged") or {}).items())
    out = [f'<div style="font-size:15px;font-weight:600;margin:4px 0 6px">{e(title)}</div>',
           _div(f"<b>text:</b> {e(text)}"), _div(e(h["summary"]) + flags),
           _div(e(f"completeness residual per layer: {resid}")
                + (f'<span style="color:#b30000;font-weight:600">  not converged: {e(bad)}</span>' if bad else ""))]
    if data.get("notes"):
        out.append('<ul style="color:#555;font-size:12px;margin:4px 0 8px;padding-left:18px">'
                   + "".join(f"<li>{e(n)}</li>" for n in data["notes"]) + "</ul>")
    return "".join(out)


def view_still(data: dict) -> str:
    """The static rendering of one example's view (the JSON :func:`..html.view_data` makes):
    header, the heatmaps the view opens on, the coloured tokens, the notes."""
    init = data.get("initial") or {}
    layer, head = int(init.get("layer", 0)), int(init.get("head", 0))
    kinds = [k for k in ("attr", "attention") if k in (data.get("maps") or {})]
    shown = kinds if init.get("kind") == "both" else [k for k in kinds if k == init.get("kind")] or kinds[:1]
    masked = data.get("masked")
    heads = data.get("heads") or ["sum"]
    window = data.get("mode") == "window"
    rows = [f"{t} {i}" if window else t for t, i in zip(data["query_tokens"], data["q_idx"])]
    cols = [f"{t} {i}" if window else t for t, i in zip(data["key_tokens"], data["k_idx"])]
    maps = []
    for kind in shown:
        full = unpack(data["maps"][kind])
        top = shared_scale(full, heads, head, masked)
        which = ("sum of heads" if kind == "attr" else "mean of heads") if heads[head] == "sum" else f"head {heads[head]}"
        caption = f"{KIND[kind]}, layer {data['layers'][layer]}, {which}; scale shared by every layer"
        maps.append(heatmap_svg(full[layer, head], kind, top, rows, cols, caption, masked,
                                row_tips=data.get("query_pieces"), col_tips=data.get("key_pieces")))
    out = [f'<div class="aa-still" style="font:13px/1.4 {FONT};color:#1d1d1d">', header_html(data)]
    if maps:
        out.append('<div style="display:flex;flex-wrap:wrap;gap:10px;align-items:flex-start;margin:8px 0">'
                   + "".join(maps) + "</div>")
    imp = data.get("importance") or {}
    if imp.get("tokens"):
        out.append(_div(html.escape(f"token importance: {imp.get('description', '')} (green +, red −)")))
        out.append(highlight_html(imp["tokens"], unpack(imp["values"]).tolist()))
    out.append(_div("a still picture of the view: with its script (a trusted notebook, a browser page) it switches"
                    " layers and heads and shows values on hover", "color:#777;font-size:11px"))
    out.append("</div>")
    return "".join(out)


def importance_svg(table: dict) -> str:
    """A head importance table [layer, head] as an SVG grid (report.js's colours)."""
    v = np.asarray(table["values"], dtype=np.float64)
    top, bottom = float(np.nanmax(v)), float(np.nanmin(v))
    c, ox, oy = 18, 22, 28
    n_l, n_h = v.shape
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="aa-still-map" width="{ox + n_h * c + 2}" '
           f'height="{oy + n_l * c + 2}" font-family="{FONT}" style="display:block">',
           f'<text x="0" y="11" font-size="12" fill="#333">{html.escape(table["name"])}</text>']
    out += [f'<text x="{ox + h * c + c / 2:g}" y="{oy - 4}" font-size="10" text-anchor="middle">{h}</text>' for h in range(n_h)]
    out += [f'<text x="{ox - 4}" y="{oy + l * c + 13}" font-size="10" text-anchor="end">{l}</text>' for l in range(n_l)]
    for l in range(n_l):
        for h in range(n_h):
            f = (v[l, h] - bottom) / (top - bottom) if top > bottom else 0.0
            fill = f"rgb({round(255 - 222 * f)},{round(255 - 160 * f)},{round(255 - 80 * f)})"
            out.append(f'<rect x="{ox + h * c}" y="{oy + l * c}" width="{c}" height="{c}" fill="{fill}"/>')
    out.append("</svg>")
    return "".join(out)


def generations_line(g: dict) -> str:
    """The report's line on a store of generations (report.js writes the same)."""
    return (f"{g['examples']} generations scored step by step, {g['steps']} steps in all; target per step:"
            f" {g['target']} given everything before it; max |step residual|: the largest of a step and layer")


def report_cell(column: str, v) -> str:
    """A report table cell as text, by its column (report.js's cell() writes the same)."""
    if v is None:
        return ""
    if column == "flags":
        return " ".join(v)
    if column == "probability":
        return f"{v:.3f}"
    if column.startswith("max |"):
        return format_number(v)
    return str(v)


def report_still(data: dict, rows_shown: int = 50) -> str:
    """The report page before its script: title, summary, head importance grids and the first
    ``rows_shown`` rows of the table (the script pages, sorts and filters them all)."""
    e = html.escape
    f = data.get("flagged") or {}
    out = [f'<div class="aa-still" style="font:13px/1.4 {FONT};color:#1d1d1d">',
           f'<h1 style="font-size:18px;margin:0 0 8px">attattr report: {e(data["title"])}</h1>',
           _div(e(f"{len(data['rows'])} examples · family {data['family']} · flagged: {f.get('wrong', 0)} wrong, "
                  f"{f.get('residual', 0)} with a large residual, {f.get('truncated', 0)} truncated, "
                  f"{f.get('unconverged', 0)} not converged"))]
    if data.get("generations"):
        out.append(_div(e(generations_line(data["generations"]))))
    if data.get("importance"):
        out.append(_div(e(f"head importance ({data['importance']['file']}; rows layers, columns heads; darker = more"
                          " important)")))
        out.append('<div style="display:flex;flex-wrap:wrap;gap:14px">'
                   + "".join(importance_svg(t) for t in data["importance"]["tables"]) + "</div>")
    cell = "padding:2px 6px;border-bottom:1px solid #e6e6e6;text-align:left"
    out.append('<table style="border-collapse:collapse;font-size:12px;margin-top:8px"><tr>'
               + "".join(f'<th style="{cell};background:#f0f2f5">{e(c)}</th>' for c in data["columns"]) + "</tr>")
    for r in data["rows"][:rows_shown]:
        vals = [report_cell(c, v) for c, v in zip(data["columns"], r)]
        out.append("<tr>" + "".join(f'<td style="{cell}">{e(str(v))}</td>' for v in vals) + "</tr>")
    out.append("</table>")
    more = len(data["rows"]) - rows_shown
    out.append(_div(e(("" if more <= 0 else f"{more:,} more rows; ") + "each example's view, sorting and filtering"
                      " need the page's script"), "color:#777;font-size:11px"))
    out.append("</div>")
    return "".join(out)


def highlight_html(tokens: Sequence[str], scores: Sequence[float], scale: float | None = None) -> str:
    """The notebook's green-token display in one call: each token on a background whose
    green (positive) or red (negative) strength is |score| / ``scale`` (default: the largest
    |score|); hovering a token shows its score. Plain HTML with inline styles, no script: a
    string (``str()`` for a file) that a notebook shows as the coloured tokens."""
    values = np.asarray(list(scores), dtype=np.float64)
    tokens = [str(t) for t in tokens]
    if len(tokens) != len(values):
        raise OptionError(f"highlight_html: {len(tokens)} tokens but {len(values)} scores")
    top = float(scale) if scale is not None else (float(np.max(np.abs(values))) if values.size else 0.0)
    spans = [
        f'<span title="{html.escape(t)} ({i}): {v:.4g}" style="background:{token_colour(v, top)};padding:1px 3px;'
        f'margin:0 1px;border-radius:3px;font-family:monospace">{html.escape(t)}</span>'
        for i, (t, v) in enumerate(zip(tokens, values))
    ]
    from .notebook import Html

    return Html('<div class="aa-highlight" style="line-height:2">' + " ".join(spans) + "</div>",
                f"highlighted text, {len(tokens)} tokens")
