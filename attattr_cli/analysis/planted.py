"""Ground truth of the built-in synthetic task: does attribution find the planted pair?

Each synthetic example records the word positions of its planted premise and
hypothesis words (``meta["pair_word_index"]``); every synthetic word is one token.
"""

from __future__ import annotations

import numpy as np

from ..errors import StoreError


def planted_positions(segment_ids, meta: dict) -> tuple[int, int]:
    """Token positions (premise word, hypothesis word) of the planted pair."""
    where = meta.get("pair_word_index") if isinstance(meta, dict) else None
    if isinstance(where, str):  # read back from a TSV column: JSON text
        import json

        try:
            where = json.loads(where)
        except json.JSONDecodeError:
            where = None
    try:
        i, j = (int(x) for x in where)
    except (KeyError, TypeError, ValueError):
        raise StoreError("example has no planted pair (is it from the synthetic task?)") from None
    seg = np.asarray(segment_ids)
    first = np.flatnonzero(seg == 0)
    second = np.flatnonzero(seg == 1)
    return int(first[i]), int(second[j])


def planted_ranks(attribution: np.ndarray, segment_ids, meta: dict) -> list[int]:
    """Per layer: the 1-based rank of the planted pair among all n*n entries of the
    head-summed attribution (ties ranked against it), counting either direction (premise word as query and
    hypothesis word as key, or the reverse) and taking the better one."""
    p, q = planted_positions(segment_ids, meta)
    ranks = []
    for layer_map in np.asarray(attribution, dtype=np.float64):
        summed = layer_map.sum(axis=0)
        best = max(summed[p, q], summed[q, p])
        # ties count against the pair: a pair scoring 0 among many zeros is not "found"
        ranks.append(int((summed >= best).sum()))
    return ranks


def planted_recovery(store, top: int = 5, level: float = 0.95) -> dict:
    """Fraction of a store's examples whose planted pair ranks in the top ``top`` of the
    head-summed attribution of at least one layer (and, for comparison, of raw attention),
    with Wilson intervals (``*_ci``) and an exact McNemar test of attribution against
    attention on the same examples (one-sided: attribution finds more)."""
    from .stats import mcnemar, proportion_ci

    found_attr: list[bool] = []
    found_attn: list[bool] = []
    per_layer = None
    for e in store:
        ranks = planted_ranks(e.attribution, e.segment_ids, e.meta)
        found_attr.append(min(ranks) <= top)
        found_attn.append(min(planted_ranks(e.attention[e.layers], e.segment_ids, e.meta)) <= top)
        row = np.asarray([r <= top for r in ranks], dtype=np.int64)
        per_layer = row if per_layer is None else per_layer + row
    total, hits_attr, hits_attn = len(found_attr), sum(found_attr), sum(found_attn)
    if not total:
        raise StoreError("the store holds no examples")
    return {
        "examples": total,
        "top": top,
        "attribution": hits_attr / total,
        "attention": hits_attn / total,
        "attribution_ci": list(proportion_ci(hits_attr, total, level)),
        "attention_ci": list(proportion_ci(hits_attn, total, level)),
        "level": level,
        "attribution_vs_attention": mcnemar(found_attr, found_attn, "greater"),
        "attribution_per_layer": (per_layer / total).tolist(),
        "attribution_per_layer_ci": [list(proportion_ci(int(k), total, level)) for k in per_layer],
    }
