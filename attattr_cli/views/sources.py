"""Sources shown (docs/long-context.md): a scored example's passages as a table (passage, its
text's start, score, rank among the passages) and a bar picture, and the source-removal check
(analysis/context_check.py) as a table and a picture of its drops. What is outside every
passage (the template, the question, the sink key 0) is said apart, never ranked.
"""

from __future__ import annotations

import base64

import numpy as np

from .notebook import new_figure, table_html

TEXT_START = 48  # characters of a passage's text shown


def text_start(text: str, width: int = TEXT_START) -> str:
    """A passage's text on one line, cut to ``width`` characters."""
    one = " ".join(str(text).split())
    return one if len(one) <= width else one[:width - 1] + "…"


def ranks(values) -> list[int]:
    """1 for the largest value, 2 for the next ... (ties in order)."""
    order = sorted(range(len(values)), key=lambda i: (-float(values[i]), i))
    out = [0] * len(values)
    for r, i in enumerate(order, 1):
        out[i] = r
    return out


def source_table(example) -> list[dict]:
    """One row per passage, in the prompt's order: passage (its number), text (its start),
    start and end (token positions), score (analysis/sources.py) and rank (1: the highest
    score among the passages)."""
    from ..analysis.sources import source_rows

    rows = source_rows(example)
    rk = ranks([r["score"] for r in rows])
    return [{"passage": r["source"], "text": text_start(r["text"]), "start": r["start"], "end": r["end"],
             "score": r["score"], "rank": rk[k]} for k, r in enumerate(rows)]


def outside(example) -> dict:
    """What the passages do not hold: the attribution of every key (``total``), of the
    passages' keys (``passages``), of the others (``outside``: template, question, answer) and
    of key 0 (``key0``, where attention sinks)."""
    from ..analysis.sources import key_importance, scores, spans_of

    v = np.asarray(key_importance(example), np.float64)
    inside = float(scores(v, spans_of(example)).sum())
    total = float(v.sum())
    return {"total": total, "passages": inside, "outside": total - inside, "key0": float(v[0]) if len(v) else 0.0}


def _title(example) -> str:
    how = (example.meta.get("sources") or {}).get("how", "") if isinstance(example.meta, dict) else ""
    how = how if how in ("paragraphs", "sentences") else ("passages of " + str(how).rsplit("/", 1)[-1] if how else "")
    return f"example {example.index}: sources ({how})" if how else f"example {example.index}: sources"


def sources_figure(example, top: int | None = None):
    """The passages as horizontal bars (their scores, in the prompt's order, the top three
    darker and numbered by rank), keys outside the passages said below: a matplotlib ``Figure``
    (``fig.save(path)``: PNG, SVG, PDF)."""
    rows = source_table(example)
    if top is not None:
        rows = [r for r in rows if r["rank"] <= top]
    n = len(rows)
    fig = new_figure(7.5, 0.9 + 0.32 * max(n, 1))
    ax = fig.add_subplot(1, 1, 1)
    y = np.arange(n)[::-1]
    vals = [r["score"] for r in rows]
    colours = ["#1f4e79" if r["rank"] <= 3 else "#8fb3d9" for r in rows]
    ax.barh(y, vals, color=colours, height=0.7)
    ax.set_yticks(y)
    ax.set_yticklabels([f"{r['passage']}: {text_start(r['text'], 36)}" for r in rows], fontsize=8)
    ax.axvline(0, color="#555", lw=0.6)
    span = max((abs(v) for v in vals), default=1.0) or 1.0
    for yy, r in zip(y, rows):
        if r["rank"] <= 3:
            ax.text(r["score"] + (0.01 if r["score"] >= 0 else -0.01) * span, yy, f"#{r['rank']}", va="center",
                    ha="left" if r["score"] >= 0 else "right", fontsize=8)
    o = outside(example)
    ax.set_xlabel("score: the passage's keys' attribution summed over layers, heads and queries", fontsize=8)
    ax.set_title(f"{_title(example)}; outside the passages {o['outside']:.3g} (key 0: {o['key0']:.3g})", fontsize=9)
    fig.tight_layout()
    return fig


def _png(fig) -> str:
    return f'<img alt="sources" src="data:image/png;base64,{base64.b64encode(fig._repr_png_()).decode()}"/>'


def sources_html(example, picture: bool = True) -> str:
    """The sources table (passage, text, start, end, score, rank) with what lies outside the
    passages said apart, and the bar picture (inline PNG)."""
    rows = source_table(example)
    o = outside(example)
    cols = ["passage", "text", "start", "end", "score", "rank"]
    parts = ['<div class="aa-sources">',
             table_html([[r[c] for c in cols] for r in rows], cols, title=_title(example), limit=60),
             f'<div style="font-size:smaller">keys outside the passages (template, question, answer; not ranked):'
             f" {o['outside']:.4g}, of it key 0 {o['key0']:.4g}; the passages {o['passages']:.4g}</div>"]
    if picture:
        parts.append(_png(sources_figure(example)))
    parts.append("</div>")
    return "".join(parts)


# -- the source-removal check -------------------------------------------------------------------
NAMES = {"attattr": "attattr", "attention": "attention", "input_x_gradient": "input × gradient", "loo": "leave-one-out"}


def removal_rows(check) -> list[dict]:
    """One row per method: its drop at each k, its share of leave-one-out's, Kendall's tau-b."""
    out = []
    loo = check.drops.get("loo", {})
    for m, by_k in check.drops.items():
        row = {"method": m}
        for k, d in by_k.items():
            row[f"drop_k{k}"] = d
            row[f"of_loo_k{k}"] = (d / loo[k]) if loo.get(k) else None
        row["tau_loo"] = check.agreement.get(m)
        out.append(row)
    return out


def removal_figure(check):
    """The drop of log p(answer) when each method's top-k sources are removed, k on the x axis:
    a matplotlib ``Figure``."""
    fig = new_figure(6.5, 3.6)
    ax = fig.add_subplot(1, 1, 1)
    methods = list(check.drops)
    ks = sorted({k for d in check.drops.values() for k in d})
    width = 0.8 / max(len(methods), 1)
    colours = {"attattr": "#1f4e79", "attention": "#e08214", "input_x_gradient": "#7f7f7f", "loo": "#2ca02c"}
    for i, m in enumerate(methods):
        xs = np.arange(len(ks)) + (i - (len(methods) - 1) / 2) * width
        ax.bar(xs, [check.drops[m].get(k, np.nan) for k in ks], width, label=NAMES.get(m, m),
               color=colours.get(m, None))
    ax.set_xticks(np.arange(len(ks)))
    ax.set_xticklabels([f"top {k}" for k in ks])
    ax.axhline(0, color="#555", lw=0.6)
    ax.set_ylabel("drop of log p(answer), nats")
    ax.set_title(f"sources removed ({len(check.sources)} sources; log p(answer) = {check.f_full:.3g})", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def removal_html(check, picture: bool = True) -> str:
    """The check as a table (one row per method: drops, share of leave-one-out's, tau), the
    sources' scores by each method, and the picture (inline PNG)."""
    rows = removal_rows(check)
    cols = list(dict.fromkeys(c for r in rows for c in r))
    methods = list(check.scores)
    src_rows = []
    rk = {m: ranks(check.scores[m]) for m in methods}
    for s, span in enumerate(check.sources):
        src_rows.append([s, text_start(span["text"])] + [f"{check.scores[m][s]:.3g} (#{rk[m][s]})" for m in methods])
    parts = ['<div class="aa-removal">',
             table_html([[r.get(c) for c in cols] for r in rows], cols,
                        title=f"source removal: log p(answer) {check.f_full:.4g}, {check.forwards} forwards"),
             table_html(src_rows, ["source", "text"] + [f"{NAMES.get(m, m)} (rank)" for m in methods],
                        title="scores of the sources", limit=60)]
    if picture:
        parts.append(_png(removal_figure(check)))
    parts.append("</div>")
    return "".join(parts)

