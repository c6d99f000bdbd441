"""Source scores: a scored example's attribution per source (docs/long-context.md).

The sources themselves, passages only (the template and the question left out), are found in
the prompt by data/sources.py and kept with the example (``meta.sources``). A source's
**score** is the sum of its keys' attribution over every scored layer, every head and every
query row: sum_{l, h, i} Attr_l,h(i, j) summed over the source's keys j. For
``continuation=...`` (F the answer's joint probability or log-probability) this is the share
of F(A) - F(0) that flows through attention to the source's tokens, per layer, added over the
layers, as ContextCite scores sources for the same F. For a generation the score is summed
over the steps (F = sum_t F_t) and each step's own score is given beside it.

Torch-free: the readers ask :func:`source_rows` for the table.
"""

from __future__ import annotations

import numpy as np

from ..errors import OptionError


def scores(key_importance: np.ndarray, spans: list[dict]) -> np.ndarray:
    """Per source, the sum of its keys' importance ([n] over the key tokens)."""
    v = np.asarray(key_importance, np.float64)
    return np.asarray([v[s["start"]:min(s["end"], len(v))].sum() for s in spans], np.float64)


def key_importance(example) -> np.ndarray:
    """Per key token: the attribution summed over layers, heads and queries (the stored
    ``key_sum`` with ``keep="sources"``, else from the maps or head sums)."""
    ks = getattr(example, "key_sum", None)
    if ks is not None:
        return np.asarray(ks, np.float64).sum(axis=0)
    return np.asarray(example.token_importance(), np.float64)


def spans_of(example) -> list[dict]:
    meta = example.meta if isinstance(example.meta, dict) else {}
    src = meta.get("sources")
    if not isinstance(src, dict) or not src.get("spans"):
        raise OptionError(f"example {example.index} has no sources: score it with sources='paragraphs', 'sentences'"
                          " or a JSONL file of passages (--sources)")
    return [{"start": int(a), "end": int(b), "text": str(t)} for a, b, t in src["spans"]]


def step_columns(example) -> list[str]:
    return [f"step_{t}" for t in range(len(example.steps or []))]


def source_rows(example) -> list[dict]:
    """One row per source: source (its number), start, end (token positions, end exclusive),
    text, score (summed over the steps of a generation) and, for a generation, ``step_t``:
    step t's own score."""
    spans = spans_of(example)
    total = scores(key_importance(example), spans)
    per_step = [scores(key_importance(st), spans) for st in (example.steps or [])]
    rows = []
    for k, s in enumerate(spans):
        row = {"source": k, "start": s["start"], "end": s["end"], "text": s["text"], "score": float(total[k])}
        for t, v in enumerate(per_step):
            row[f"step_{t}"] = float(v[k])
        rows.append(row)
    return rows


SOURCE_COLUMNS = ["source", "start", "end", "text", "score"]
