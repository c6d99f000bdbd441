"""Adversarial triggers from attention attribution (Hao et al. 2021): per example the top-2
entries (i, j) of the head with the largest attribution entry are its two *patterns*, a
pattern's *trigger* its distinct tokens in position order (with segment and relative
position); the same trigger is aggregated across examples and ranked (:func:`aggregate`).
By default only entries between two different real tokens count; ``special=True`` follows
the 2021 code (:func:`example_patterns`). docs/triggers.md, "Extraction"; docs/method.md
section 4.1.

Relative positions (both kept): ``relative = offset / (length - 1)`` (0 in a one-token
segment) and the 2021 code's ``reference = (offset + 1) / length``.

Nothing here prints, exits or reads files beyond what it is given.
"""

from __future__ import annotations

import csv
import io
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

import numpy as np

from ..errors import OptionError, StoreError
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity

FORMAT = "attattr.triggers"
VERSION = 1
RANKINGS = ("count", "total", "mean")
ENTRIES_PER_EXAMPLE = 2  # the 2021 code's top-2 entries


@dataclass(frozen=True)
class TokenAt:
    """One token of a pattern: its string, segment (0 or 1), offset in the segment, the
    segment's length, and its absolute position in the example."""

    token: str
    segment: int
    offset: int
    length: int
    position: int

    @property
    def relative(self) -> float:
        return self.offset / (self.length - 1) if self.length > 1 else 0.0

    @property
    def reference(self) -> float:
        return (self.offset + 1) / self.length


@dataclass
class Pattern:
    """One top entry of one example's top head: query i, key j, its attribution value,
    and the trigger it makes: the distinct non-special tokens of (i, j) in position order."""

    example: int
    layer: int
    head: int
    query: int
    key: int
    value: float
    target: int  # the class the attribution is for (model label index)
    gold: int  # model label index, -1 unknown
    pred: int
    tokens: list[TokenAt]
    query_token: str = ""
    key_token: str = ""

    @property
    def key_tuple(self) -> tuple:
        return tuple((t.segment, t.token) for t in self.tokens)

    @property
    def label(self) -> str:
        return f"{self.query_token} -> {self.key_token}"


@dataclass
class Trigger:
    """A trigger aggregated across examples."""

    tokens: list[str]
    segments: list[int]
    relative: list[float]
    reference: list[float]
    count: int
    mean_strength: float
    total_strength: float
    classes: dict[str, int]
    label: str  # the class it pushes towards (most frequent target)
    patterns: dict[str, int] = field(default_factory=dict)  # "query -> key" -> count
    examples: list[int] = field(default_factory=list)
    rank: int = 0
    class_rank: int = 0

    def to_json(self) -> dict:
        return {
            "rank": self.rank,
            "class": self.label,
            "class_rank": self.class_rank,
            "tokens": self.tokens,
            "segments": self.segments,
            "relative": [round(x, 6) for x in self.relative],
            "reference": [round(x, 6) for x in self.reference],
            "count": self.count,
            "mean_strength": self.mean_strength,
            "total_strength": self.total_strength,
            "classes": self.classes,
            "patterns": self.patterns,
            "examples": self.examples,
        }


def segments_of(segment_ids: Sequence[int]) -> dict[int, list[int]]:
    """Segment id -> the absolute positions of its tokens (special tokens, id < 0, left out)."""
    out: dict[int, list[int]] = {}
    for pos, s in enumerate(np.asarray(segment_ids).tolist()):
        if s >= 0:
            out.setdefault(int(s), []).append(pos)
    return out


def top_head(attribution: np.ndarray, layers: Sequence[int]) -> tuple[int, int, np.ndarray]:
    """(layer, head, map) of the head with the largest entry: per layer the head holding
    the layer's largest entry, then across layers the largest of those (first on ties)."""
    a = np.asarray(attribution)
    if a.ndim != 4 or a.shape[2] != a.shape[3] or a.shape[0] == 0:
        raise StoreError(f"attribution must be [layers, heads, n, n] with at least one layer, got {list(a.shape)}")
    if np.isnan(a).any() or np.isposinf(a).any():
        raise StoreError("the attribution holds NaN or infinite values")
    flat = a.reshape(a.shape[0], -1)
    assert flat.max() > -np.inf  # some entry between real tokens
    li = int(np.argmax(flat.max(1)))  # the head holding a layer's largest entry holds that maximum
    head = int(np.argmax(flat[li])) // (a.shape[2] * a.shape[3])
    return int(layers[li]) if len(layers) == a.shape[0] else li, head, a[li, head]


def example_patterns(
    attribution: np.ndarray,
    tokens: Sequence[str],
    segment_ids: Sequence[int],
    layers: Sequence[int],
    *,
    example: int = 0,
    target: int = -1,
    gold: int = -1,
    pred: int = -1,
    entries: int = ENTRIES_PER_EXAMPLE,
    special: bool = False,
) -> list[Pattern]:
    """The example's patterns: the top ``entries`` entries of its top head, among entries
    between two different real tokens, or with ``special`` (the 2021 code) among all entries,
    an entry touching a special token keeping only its other token (an entry of two special
    tokens keeps none and is returned all the same, so that callers can count it)."""
    a = np.asarray(attribution, dtype=np.float64)
    seg_arr = np.asarray(segment_ids).tolist()
    n = a.shape[-1] if a.ndim == 4 else 0
    if len(tokens) != n or len(seg_arr) != n:
        raise StoreError(f"example {example}: {len(tokens)} tokens but an attribution of shape {list(a.shape)}")
    if not special:
        real = np.asarray(seg_arr) >= 0
        if real.sum() == 0:
            return []
        keep = real[:, None] & real[None, :] & ~np.eye(n, dtype=bool)
        a = np.where(keep[None, None], a, -np.inf)
    layer, head, m = top_head(a, layers)
    flat = m.reshape(-1)
    # stable descending order: the largest first, ties by position (row-major)
    order = [k for k in np.argsort(-flat, kind="stable")[:entries].tolist() if np.isfinite(flat[k])]
    segs = segments_of(segment_ids)
    out = []
    for idx in order:
        i, j = divmod(int(idx), n)
        toks = []
        for pos in sorted({i, j}):
            s = int(seg_arr[pos])
            if s < 0:
                continue
            where = segs[s]
            toks.append(TokenAt(str(tokens[pos]), s, where.index(pos), len(where), pos))
        out.append(Pattern(example, layer, head, i, j, float(flat[idx]), int(target), int(gold), int(pred), toks,
                           str(tokens[i]), str(tokens[j])))
    return out


def patterns_from_store(store, progress=None, entries: int = ENTRIES_PER_EXAMPLE,
                        min_tokens: int = 0, special: bool = False,
                        indices: Sequence[int] | None = None, counts: dict | None = None,
                        words: bool = False) -> list[Pattern]:
    """The patterns of the store's examples (all, or those of ``indices`` that it holds),
    skipping examples with fewer than ``min_tokens`` tokens (special tokens included) and
    those flagged ``nonfinite`` (counted in ``counts["skipped_nonfinite"]`` when given).
    ``words``: patterns of words, the maps merged first (docs/triggers.md, "Words");
    ``min_tokens`` still counts tokens."""
    from .aggregate import aggregate_example

    out: list[Pattern] = []
    held = store.indices()
    if indices is not None:
        wanted = set(indices)
        held = [i for i in held if i in wanted]
    if not held:
        raise StoreError(f"{store.path} holds no examples" + ("" if indices is None else " of those asked for"))
    indices, skipped = store.finite(held)
    if counts is not None:
        counts["skipped_nonfinite"] = skipped
        counts["unconverged"] = len(store.unconverged(indices))
        counts["used"] = len(indices)
    if not indices:
        raise StoreError(f"every example asked for in {store.path} holds NaN or inf (flagged 'nonfinite')")
    for k, i in enumerate(indices):
        e = store.get(i)
        if len(e.tokens) >= min_tokens:
            if words:
                e = aggregate_example(e, "words")
            out.extend(example_patterns(e.attribution, e.tokens, e.segment_ids, e.layers, example=e.index,
                                        target=e.target, gold=e.gold, pred=e.pred, entries=entries, special=special))
        if progress is not None:
            progress(k + 1, len(indices), f"example {i}")
    return out


def aggregate(patterns: Iterable[Pattern], label_names: Sequence[str], rank_by: str = "count",
              max_examples: int = 20) -> list[Trigger]:
    """The same trigger (tokens, segments, order) across examples, ranked (best first)."""
    if rank_by not in RANKINGS:
        raise OptionError(f"unknown ranking '{rank_by}'; available: {', '.join(RANKINGS)}")
    groups: dict[tuple, list[Pattern]] = {}
    for p in patterns:
        if p.tokens:
            groups.setdefault(p.key_tuple, []).append(p)

    def name(k: int) -> str:
        return str(label_names[k]) if 0 <= k < len(label_names) else str(k)

    triggers = []
    for key, group in groups.items():
        values = np.asarray([p.value for p in group], dtype=np.float64)
        classes = Counter(name(p.target) for p in group)
        # the class it pushes towards: the most frequent; ties by the larger summed strength
        label = max(classes, key=lambda c: (classes[c], sum(p.value for p in group if name(p.target) == c)))
        n_tok = len(key)
        triggers.append(Trigger(
            tokens=[t for _, t in key],
            segments=[s for s, _ in key],
            relative=[float(np.mean([p.tokens[k].relative for p in group])) for k in range(n_tok)],
            reference=[float(np.mean([p.tokens[k].reference for p in group])) for k in range(n_tok)],
            count=len(group),
            mean_strength=float(values.mean()),
            total_strength=float(values.sum()),
            classes=dict(sorted(classes.items(), key=lambda kv: (-kv[1], kv[0]))),
            label=label,
            patterns=dict(Counter(p.label for p in group).most_common()),
            examples=sorted({p.example for p in group})[:max_examples],
        ))
    sort_key = {
        "total": lambda t: (-t.total_strength, -t.count, t.tokens),
        "count": lambda t: (-t.count, -t.total_strength, t.tokens),
        "mean": lambda t: (-t.mean_strength, -t.count, t.tokens),
    }[rank_by]
    triggers.sort(key=sort_key)
    per_class: Counter = Counter()
    for r, t in enumerate(triggers, start=1):
        t.rank = r
        per_class[t.label] += 1
        t.class_rank = per_class[t.label]
    return triggers


def select(triggers: list[Trigger], top: int | None, per_class: bool,
           label_names: Sequence[str] | None = None) -> list[Trigger]:
    """The ``top`` best overall, or with ``per_class`` the ``top`` best of each class
    (classes in label order; ranks kept)."""
    if top is not None and top < 1:
        raise OptionError(f"top_k (--top-k) must be at least 1, got {top}")
    if not per_class:
        return triggers[:top] if top else list(triggers)
    order = list(label_names or []) + sorted({t.label for t in triggers} - set(label_names or []))
    out = []
    for c in order:
        mine = [t for t in triggers if t.label == c]
        out.extend(mine[:top] if top else mine)
    return out


def triggers_document(triggers: list[Trigger], *, label_names: Sequence[str], per_class: bool, top: int | None,
                      rank_by: str, source: dict, patterns: list[Pattern]) -> dict:
    """The JSON written by ``attattr triggers``."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "label_names": list(label_names),
        "per_class": per_class,
        "top": top,
        "rank_by": rank_by,
        "examples": len({p.example for p in patterns}),
        "patterns": len(patterns),
        "patterns_without_tokens": sum(1 for p in patterns if not p.tokens),
        "source": source,
        "triggers": [t.to_json() for t in triggers],
    }


CSV_COLUMNS = ("rank", "class", "class_rank", "tokens", "segments", "relative", "reference", "count",
               "mean_strength", "total_strength", "classes", "patterns")


def triggers_csv(triggers: list[Trigger]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for t in triggers:
        d = t.to_json()
        w.writerow([
            d["rank"], d["class"], d["class_rank"], " ".join(d["tokens"]), " ".join(map(str, d["segments"])),
            " ".join(f"{x:.3f}" for x in d["relative"]), " ".join(f"{x:.3f}" for x in d["reference"]),
            d["count"], f"{d['mean_strength']:.6g}", f"{d['total_strength']:.6g}",
            strict_dumps(d["classes"], ensure_ascii=False), strict_dumps(d["patterns"], ensure_ascii=False),
        ])
    return buf.getvalue()


def load_triggers(path) -> dict:
    """Read a triggers JSON (from ``attattr triggers``); raises OptionError on a bad file."""
    from pathlib import Path

    p = Path(path)
    if not p.exists():
        raise OptionError(f"no such triggers file: {p}")
    try:
        doc = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise OptionError(f"{p} is not a triggers JSON ({type(exc).__name__}: {exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise OptionError(f"{p} is not an attattr triggers file (no \"format\": \"{FORMAT}\")")
    if int(doc.get("version", 0)) > VERSION:
        raise OptionError(f"{p} has triggers format version {doc.get('version')}, newer than this attattr reads ({VERSION})")
    for k, t in enumerate(doc.get("triggers", [])):
        n = len(t.get("tokens", []))
        if n == 0 or len(t.get("segments", [])) != n or len(t.get("relative", [])) != n:
            raise OptionError(f"{p}: trigger {k} needs tokens, segments and relative of the same length")
    if not doc.get("triggers"):
        raise OptionError(f"{p} holds no triggers")
    return doc


def select_by_length(tokenizer, rows: Sequence, chosen: Sequence[int], min_tokens: int = 0,
                     limit: int | None = None) -> list[int]:
    """The indices among ``chosen`` (positions in ``rows``) whose example has at least
    ``min_tokens`` tokens, special tokens included; the first ``limit`` of them."""
    if min_tokens <= 0 and limit is None:
        return list(chosen)
    from ..engine.encoding import encode

    keep = []
    for i in chosen:
        if len(encode(tokenizer, rows[i], tokens=False).input_ids) >= min_tokens:
            keep.append(i)
            if limit is not None and len(keep) >= limit:
                break
    if not keep:
        raise OptionError(f"no selected example has at least {min_tokens} tokens")
    return keep
