"""Source scores: a scored example's attribution per source (passages found by
data/sources.py, kept as ``meta.sources``). A source's **score** is
sum_{l, h, i >= R} Attr_l,h(i, j) summed over its keys j: every scored layer and head, the
query rows from the end of the last passage on (R); the rows inside the context are left out
(docs/long-context.md, "The first-passage bias"). For a generation the score is summed over
the steps (F = sum_t F_t), each step's own beside it. docs/long-context.md explains the
share of F(A) - F(0) this measures.

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
    """Per key token: the attribution of the query rows that read the passages, from the end of
    the last one on (the question, the template's tail, the answer's rows), summed over layers,
    heads and those rows: the stored ``read_sum`` (``keep="sources"``), else the maps or head
    sums reduced so. A store of schema 1.5 kept every query row's (``key_sum``): that."""
    rs = getattr(example, "read_sum", None)
    if rs is not None:
        return np.asarray(rs, np.float64).sum(axis=0)
    meta = example.meta if isinstance(example.meta, dict) else {}
    spans = (meta.get("sources") or {}).get("spans") if isinstance(meta.get("sources"), dict) else None
    first = max(int(s[1]) for s in spans) if spans else 0
    for name, rows in (("attribution", (0, 1, 2)), ("head_sum", (0, 1))):
        maps = getattr(example, name, None)
        if maps is not None:
            m = np.asarray(maps)
            return m[..., first:, :].sum(axis=rows, dtype=np.float64)
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
