"""Inserting triggers into examples and measuring what they do (the paper's Table 2): each
example tokenised as the model sees it, a trigger's tokens inserted as word pieces into the
segment they came from (``position``: ``relative``, ``reference``, ``start``, ``end`` or a
fraction), the example's own tokens cut from the end of its longer segment when too long,
every variant classified again, and the triggers judged against seeded random-token
*controls* of the same layout (``CONTROLS`` per layout; :func:`control_statistics`).
docs/triggers.md, "Attack"; docs/method.md section 4.2.

Nothing here prints or exits; the data file is only read.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from ..data.types import Example
from ..errors import DataError, OptionError
from ..engine.batching import classify, pad_id_of
from ..engine.encoding import encode
from ..models.loading import LoadedModel, align_labels
from .ablation import counting

FORMAT = "attattr.attack"
VERSION = 2  # 2: control distributions, per-trigger and per-class tests
CONTROLS = 20  # default controls per layout (trigger size and segments)
ALPHA = 0.05
POSITION_MODES = ("relative", "reference", "start", "end")

Progress = Callable[[int, int, str], None]


# ----------------------------------------------------------------------------- encoding


@dataclass
class Framed:
    """One example as the model's tokenizer frames it."""

    ids: list[int]
    seq: list[int]  # 0 / 1 for the segments, -1 for special tokens
    types: list[int] | None  # token type ids where the model takes them

    def segment(self, s: int) -> list[int]:
        return [i for i, x in zip(self.ids, self.seq) if x == s]


def frame(tokenizer, example: Example) -> Framed:
    """Tokenise an example with special tokens (no truncation)."""
    enc = encode(tokenizer, example, tokens=False)
    return Framed(enc.input_ids, enc.segment_ids, enc.token_type_ids)


@dataclass
class Variant:
    """An example with a trigger inserted: the ids the model sees, which are trigger tokens,
    and whether the example's own text was cut to fit."""

    ids: list[int]
    types: list[int] | None
    seq: list[int]
    is_trigger: list[bool]
    truncated: bool = False
    skipped: int = 0  # trigger tokens with no segment to go into


# ----------------------------------------------------------------------------- insertion


def parse_position(position: str | float) -> str | float:
    if isinstance(position, (int, float)):
        value = float(position)
    elif position in POSITION_MODES:
        return position
    else:
        try:
            value = float(position)
        except ValueError:
            raise OptionError(
                f"unknown --position '{position}'; use {', '.join(POSITION_MODES)} or a number in [0, 1]"
            ) from None
    if not 0.0 <= value <= 1.0:
        raise OptionError(f"--position {position} is outside [0, 1]")
    return value


def _round(x: float) -> int:
    return int(math.floor(x + 0.5))


def insert_into_segment(seg: list, items: Sequence[tuple[object, float, float]], position: str | float = "relative"
                        ) -> tuple[list, list[bool]]:
    """Insert ``items`` (value, relative, reference) into the list ``seg``.

    Returns the new list and a mask of which entries are inserted items.
    """
    mode = parse_position(position)
    L = len(seg)
    if mode == "reference":
        out = list(seg)
        mask = [False] * L
        c = len(items)
        prev = -1
        for value, _rel, ref in items:
            cur = _round((L + c) * ref)
            if cur == prev:
                cur += 1
            prev = cur
            cur = min(max(cur, 0), len(out))
            out.insert(cur, value)
            mask.insert(cur, True)
        return out, mask

    def before(rel: float) -> int:  # the segment position an item goes before (L: appended)
        return _round(min(max({"start": 0.0, "end": 1.0, "relative": rel}.get(mode, mode), 0.0), 1.0) * L)

    # (position, 0 for an item / 1 for the segment's own entry, item order, value)
    merged = sorted([(before(rel), 0, k, value) for k, (value, rel, _ref) in enumerate(items)]
                    + [(i, 1, 0, x) for i, x in enumerate(seg)], key=lambda e: e[:3])
    return [e[3] for e in merged], [e[1] == 0 for e in merged]


def attack_example(framed: Framed, trigger_ids: Sequence[int], segments: Sequence[int], relative: Sequence[float],
                   reference: Sequence[float] | None = None, position: str | float = "relative",
                   max_length: int | None = None) -> Variant:
    """Insert a trigger (ids with their segments and relative positions) into one framed
    example, then cut the example's own tokens (never the trigger's) to ``max_length``."""
    reference = list(reference) if reference is not None else [min(max(r, 0.0), 1.0) for r in relative]
    present = sorted({s for s in framed.seq if s >= 0})
    # the framed sequence as runs: special tokens stay, each segment is rebuilt
    new_ids: list[int] = []
    new_seq: list[int] = []
    new_types: list[int] = []
    is_trig: list[bool] = []
    skipped = sum(1 for s in segments if s not in present)
    done: set[int] = set()
    types = framed.types
    for pos, (tid, s) in enumerate(zip(framed.ids, framed.seq)):
        if s < 0:
            new_ids.append(tid)
            new_seq.append(-1)
            new_types.append(types[pos] if types is not None else 0)
            is_trig.append(False)
            continue
        if s in done:
            continue
        done.add(s)
        seg = framed.segment(s)
        seg_type = types[pos] if types is not None else 0
        items = [(t, r, f) for t, ss, r, f in zip(trigger_ids, segments, relative, reference) if ss == s]
        ids, mask = insert_into_segment(seg, items, position)
        new_ids.extend(ids)
        new_seq.extend([s] * len(ids))
        new_types.extend([seg_type] * len(ids))
        is_trig.extend(mask)
    variant = Variant(new_ids, new_types if types is not None else None, new_seq, is_trig, False, skipped)
    if max_length is not None and len(variant.ids) > max_length:
        _truncate(variant, max_length)
    return variant


def _truncate(v: Variant, max_length: int) -> None:
    """Cut the example's own tokens, the last of the segment with more of them first."""
    while len(v.ids) > max_length:
        own: dict[int, list[int]] = {}
        for pos, (s, t) in enumerate(zip(v.seq, v.is_trigger)):
            if s >= 0 and not t:
                own.setdefault(s, []).append(pos)
        if not own:
            raise DataError(
                f"the trigger and the special tokens alone take {len(v.ids)} tokens; the model takes at most {max_length}"
            )
        s = max(own, key=lambda k: (len(own[k]), -k))  # the longer segment; ties: the first
        cut = own[s][-1]
        for lst in (v.ids, v.seq, v.is_trigger):
            del lst[cut]
        if v.types is not None:
            del v.types[cut]
        v.truncated = True


def clean_variant(framed: Framed, max_length: int | None) -> Variant:
    v = Variant(list(framed.ids), list(framed.types) if framed.types is not None else None, list(framed.seq),
                [False] * len(framed.ids))
    if max_length is not None and len(v.ids) > max_length:
        _truncate(v, max_length)
    return v


def variant_texts(tokenizer, v: Variant) -> tuple[str, str | None]:
    """The attacked example as text (each segment decoded)."""
    segs = sorted({s for s in v.seq if s >= 0})
    texts = [tokenizer.decode([i for i, s in zip(v.ids, v.seq) if s == k]) for k in segs]
    return (texts[0] if texts else ""), (texts[1] if len(texts) > 1 else None)


# ----------------------------------------------------------------------------- evaluation


def predict(loaded: LoadedModel, variants: Sequence[Variant], batch_size: int = 64,
            progress: Callable[[int], None] | None = None) -> np.ndarray:
    """The model's predicted class (model label index) for each variant."""
    with_types = any(v.types is not None for v in variants)
    rows = []
    for v in variants:
        row = {"input_ids": v.ids, "attention_mask": [1] * len(v.ids)}
        if with_types:
            row["token_type_ids"] = v.types if v.types is not None else [0] * len(v.ids)
        rows.append(row)
    logits = classify(loaded.model, rows, pad_id_of(loaded.model, loaded.tokenizer), batch_size,
                      None if progress is None else lambda _done, _total, b: progress(len(b.positions)))
    return logits.argmax(-1).numpy().astype(np.int64) if len(variants) else np.zeros(0, dtype=np.int64)


# ----------------------------------------------------------------------------- the attack


@dataclass
class Insertion:
    """A trigger or a control as inserted."""

    name: str
    kind: str  # "trigger" or "control"
    tokens: list[str]
    segments: list[int]
    relative: list[float]
    reference: list[float]
    label: str | None = None  # the class a trigger pushes towards
    rank: int | None = None
    class_rank: int | None = None
    mirrors: str | None = None  # the trigger a control copies the layout of
    extra: dict = field(default_factory=dict)


def from_document(doc: dict, top: int | None = 3) -> list[Insertion]:
    """The triggers of a triggers JSON to use: the ``top`` best of each class if the file
    was made with --per-class, else the ``top`` best overall (None: all)."""
    if top is not None and top < 1:
        raise OptionError(f"top_k must be at least 1, got {top}")
    if (doc.get("source") or {}).get("aggregate") == "words":
        raise OptionError("these triggers are words (triggers --aggregate words); an attack inserts tokens:"
                          " extract the triggers without --aggregate")
    chosen = []
    for t in doc["triggers"]:
        rank = t.get("class_rank") if doc.get("per_class") else t.get("rank")
        if top is None or rank is None or rank <= top:
            chosen.append(t)
    if not doc.get("per_class") and top is not None:
        chosen = chosen[:top]
    out = []
    for k, t in enumerate(chosen, start=1):
        out.append(Insertion(
            name=f"T{k}", kind="trigger", tokens=[str(x) for x in t["tokens"]], segments=[int(s) for s in t["segments"]],
            relative=[float(r) for r in t["relative"]],
            reference=[float(r) for r in t.get("reference", t["relative"])],
            label=t.get("class"), rank=t.get("rank"), class_rank=t.get("class_rank"),
        ))
    return out


def data_vocabulary(tokenizer, framed: Sequence[Framed], exclude: set[str]) -> list[str]:
    """The distinct non-special tokens of the data (sorted), without ``exclude``."""
    seen: set[int] = set()
    for f in framed:
        seen.update(i for i, s in zip(f.ids, f.seq) if s >= 0)
    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    tokens = tokenizer.convert_ids_to_tokens(sorted(seen - special))
    return sorted({t for t in tokens if t not in exclude})


def layout_of(tokens: Sequence, segments: Sequence[int]) -> tuple[int, tuple[int, ...]]:
    """A trigger's layout: its size and the segment of each token."""
    return len(tokens), tuple(segments)


def layout_name(layout: tuple[int, tuple[int, ...]]) -> str:
    size, segs = layout
    return f"{size} token{'s' if size != 1 else ''}, segment{'s' if len(set(segs)) > 1 else ''} " + ",".join(map(str, segs))


def make_controls(triggers: Sequence[Insertion], vocabulary: Sequence[str], count: int, seed: int = 0,
                  per_layout: bool = False) -> list[Insertion]:
    """Random-token controls. ``per_layout``: ``count`` for every layout (size and segments)
    of the triggers, control k of a layout mirroring that layout's trigger k (cycling); else
    ``count`` in all, control k mirroring trigger k (cycling)."""
    if count < 0:
        raise OptionError(f"--controls must be at least 0, got {count}")
    if count and not triggers:
        raise OptionError("controls mirror triggers: there are no triggers")
    rng = random.Random(seed)
    if per_layout:
        groups: dict[tuple, list[Insertion]] = {}
        for t in triggers:
            groups.setdefault(layout_of(t.tokens, t.segments), []).append(t)
        plan = [g[k % len(g)] for g in groups.values() for k in range(count)]
    else:
        plan = [triggers[k % len(triggers)] for k in range(count)]
    out = []
    for k, t in enumerate(plan):
        if len(vocabulary) < len(t.tokens):
            raise DataError(f"the data has only {len(vocabulary)} tokens besides the triggers' to draw controls from")
        tokens = rng.sample(list(vocabulary), len(t.tokens))
        out.append(Insertion(name=f"C{k + 1}", kind="control", tokens=tokens, segments=list(t.segments),
                             relative=list(t.relative), reference=list(t.reference), mirrors=t.name))
    return out


def _token_ids(tokenizer, ins: Insertion) -> list[int]:
    ids = tokenizer.convert_tokens_to_ids(ins.tokens)
    unk = getattr(tokenizer, "unk_token_id", None)
    for tok, i in zip(ins.tokens, ids):
        if i is None or (i == unk and tok != getattr(tokenizer, "unk_token", None)):
            raise DataError(f"trigger token '{tok}' is not in the model's vocabulary (triggers from another model?)")
    return list(ids)


def _class_index(name: str | None, loaded: LoadedModel) -> int | None:
    if name is None:
        return None
    names = [n.lower() for n in loaded.label_names]
    return names.index(name.lower()) if name.lower() in names else None


def run_attack(
    loaded: LoadedModel,
    examples: Sequence[Example],
    task_labels: Sequence[str] | None,
    triggers: Sequence[Insertion],
    *,
    controls: int | None = None,
    seed: int = 0,
    position: str | float = "relative",
    batch_size: int = 64,
    keep_texts: bool = False,
    columns: int = 3,
    alpha: float = ALPHA,
    progress: Progress | None = None,
) -> dict:
    """Insert every trigger (and ``controls`` controls per layout, default ``CONTROLS``) into
    every example and classify; the result is the ``attattr attack`` JSON document
    (accuracies as fractions) with the per-class table of the paper's Table 2 under
    ``table``, and the tests against the controls (:func:`control_statistics`)."""
    if not 0.0 < alpha < 1.0:
        raise OptionError(f"--alpha must be in (0, 1), got {alpha}")
    controls = CONTROLS if controls is None else controls
    position = parse_position(position)
    if not examples:
        raise DataError("no examples to attack")
    tok = loaded.tokenizer
    label_map, how = align_labels(task_labels, loaded)
    class_names = list(task_labels) if task_labels is not None else list(loaded.label_names)
    max_length = loaded.arch.max_length
    framed = [frame(tok, e) for e in examples]
    n_segments = max(len({s for s in f.seq if s >= 0}) for f in framed)
    for t in triggers:
        if any(s >= n_segments for s in t.segments):
            raise OptionError(
                f"trigger {t.name} ({' '.join(t.tokens)}) has tokens for segment {max(t.segments)}, "
                f"but the data has {n_segments} segment{'s' if n_segments > 1 else ''}"
            )
    trig_ids = [_token_ids(tok, t) for t in triggers]
    exclude = {x for t in triggers for x in t.tokens}
    ctrl = make_controls(triggers, data_vocabulary(tok, framed, exclude), controls, seed, per_layout=True)
    inserts = list(triggers) + ctrl
    all_ids = trig_ids + [_token_ids(tok, c) for c in ctrl]

    gold = np.asarray([label_map[e.label] if e.label is not None else -1 for e in examples])
    tick = counting(progress, len(examples) * (1 + len(inserts)), "")
    tick(0)
    clean = [clean_variant(f, max_length) for f in framed]
    before = predict(loaded, clean, batch_size, tick)

    def per_class(pred):  # per class, and over every example with a known label
        def count(sel):
            n, right = int(sel.sum()), int((pred[sel] == gold[sel]).sum())
            return {"n": n, "correct": right, "accuracy": (right / n) if n else None}

        return {c: count(gold == label_map[k]) for k, c in enumerate(class_names)}, count(gold >= 0)

    before_cls, before_all = per_class(before)
    results = []
    texts: list[dict] = []
    # every insertion's variants in one run: padded batches of similar length across them
    every = [[attack_example(f, ids, ins.segments, ins.relative, ins.reference, position, max_length)
              for f in framed] for ins, ids in zip(inserts, all_ids)]
    flat = predict(loaded, [v for variants in every for v in variants], batch_size, tick)
    preds = list(flat.reshape(len(inserts), len(framed)))  # [insertion][example]
    for ins, variants, pred in zip(inserts, every, preds):
        cls, overall = per_class(pred)
        target = _class_index(ins.label, loaded)
        results.append({
            "name": ins.name, "kind": ins.kind, "tokens": ins.tokens, "segments": ins.segments,
            "relative": ins.relative, "class": ins.label, "rank": ins.rank, "class_rank": ins.class_rank,
            "mirrors": ins.mirrors, "accuracy": {c: v["accuracy"] for c, v in cls.items()},
            "correct": {c: v["correct"] for c, v in cls.items()}, "overall_accuracy": overall["accuracy"],
            "flipped": int((pred != before).sum()),
            "to_class": (float((pred == target).mean()) if target is not None else None),
            "truncated": sum(v.truncated for v in variants),
            "skipped_tokens": sum(v.skipped for v in variants),
        })
        if keep_texts:
            for e, v, p in zip(examples, variants, pred):
                a, b = variant_texts(tok, v)
                texts.append({"insert": ins.name, "kind": ins.kind, "index": e.index, "text_a": a, "text_b": b,
                              "gold": class_names[e.label] if e.label is not None else None,
                              "pred": loaded.label_names[int(p)]})
    table = summary_table(class_names, label_map, before_cls, results, loaded, columns)
    control_statistics(results, preds, before, gold, class_names, label_map, table, loaded, alpha, seed)
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "model": loaded.model_id,
        "examples": len(examples),
        "classes": class_names,
        "label_mapping": how,
        "position": position,
        "seed": seed,
        "controls_per_layout": controls,
        "alpha": alpha,
        "tests": ("per trigger: exact permutation p-value of its accuracy drop among the controls of its layout, "
                  "(1 + #controls dropping at least as much) / (n + 1); per class: two-sample permutation test "
                  "of the mean drop, the other classes' triggers against all controls (exact up to 200,000 "
                  "splits, else 10,000 seeded random ones), Holm-adjusted over the classes"),
        "max_length": max_length,
        "truncated_before": sum(v.truncated for v in clean),
        "before": before_cls,
        "overall_before": before_all["accuracy"],
        "triggers": [r for r in results if r["kind"] == "trigger"],
        "controls": [r for r in results if r["kind"] == "control"],
        "table": table,
    }
    if keep_texts:
        doc["texts"] = texts
    return doc


def summary_table(class_names, label_map, before_cls, results, loaded, columns: int = 3) -> list[dict]:
    """Per gold class: accuracy before, under the triggers that push towards another class
    (the first ``columns`` by rank, and their mean over all such triggers), and the mean
    under the controls. A trigger with no known class counts against every class."""
    rows = []
    for k, c in enumerate(class_names):
        model_k = label_map[k]
        against = [r for r in results if r["kind"] == "trigger" and _class_index(r["class"], loaded) != model_k]
        ctrl = [r for r in results if r["kind"] == "control"]
        accs = [r["accuracy"][c] for r in against if r["accuracy"][c] is not None]
        caccs = [r["accuracy"][c] for r in ctrl if r["accuracy"][c] is not None]
        rows.append({
            "class": c,
            "n": before_cls[c]["n"],
            "before": before_cls[c]["accuracy"],
            "triggers": [{"name": r["name"], "tokens": r["tokens"], "class": r["class"], "accuracy": r["accuracy"][c]}
                         for r in against[:columns]],
            "trigger_mean": float(np.mean(accs)) if accs else None,
            "trigger_count": len(accs),
            "control_mean": float(np.mean(caccs)) if caccs else None,
            "control_count": len(caccs),
        })
    return rows


def control_statistics(results: list[dict], preds: Sequence[np.ndarray], before: np.ndarray, gold: np.ndarray,
                       class_names: Sequence[str], label_map: Sequence[int], table: list[dict], loaded,
                       alpha: float = ALPHA, seed: int = 0) -> None:
    """Judge the triggers against the controls' distribution; adds to the trigger rows
    (``drop``, ``controls``, ``percentile``, ``p``), the control rows (``drop``: on every
    example of another class than the one its trigger pushes to) and the table rows (the
    controls' spread, the most damaging control, ``p``, ``p_holm``, ``beats_controls``)."""
    from . import stats

    right_before = before == gold
    known = gold >= 0
    by_name = {r["name"]: r for r in results}

    def drop(pred: np.ndarray, sel: np.ndarray) -> float | None:
        return float(right_before[sel].mean() - (pred[sel] == gold[sel]).mean()) if sel.any() else None

    def attacked(row: dict | None) -> np.ndarray:  # known labels but the trigger's class (all without one)
        target = None if row is None else _class_index(row["class"], loaded)
        return known & (gold != target) if target is not None else known

    controls = [(r, p) for r, p in zip(results, preds) if r["kind"] == "control"]
    for row, pred in zip(results, preds):
        lay = layout_of(row["tokens"], row["segments"])
        row["layout"] = layout_name(lay)
        if row["kind"] == "control":
            row["drop"] = drop(pred, attacked(by_name.get(row["mirrors"])))
            continue
        sel = attacked(row)
        row["drop"] = d = drop(pred, sel)
        null = [x for r, p in controls if layout_of(r["tokens"], r["segments"]) == lay
                and (x := drop(p, sel)) is not None]
        row["controls"] = {
            "n": len(null),
            "drop_mean": float(np.mean(null)) if null else None,
            "drop_sd": float(np.std(null, ddof=1)) if len(null) > 1 else None,
            "drop_max": float(np.max(null)) if null else None,
        }
        row["percentile"] = stats.percentile(d, null) if d is not None else None
        row["p"] = stats.rank_p_value(d, null) if d is not None else None
    for k, (c, trow) in enumerate(zip(class_names, table)):
        sel = known & (gold == label_map[k])
        t_drops = [x for r, p in zip(results, preds) if r["kind"] == "trigger"
                   and _class_index(r["class"], loaded) != label_map[k] and (x := drop(p, sel)) is not None]
        c_named = [(r, x) for r, p in controls if (x := drop(p, sel)) is not None]
        c_drops = [x for _r, x in c_named]
        trow["trigger_drop"] = float(np.mean(t_drops)) if t_drops else None
        trow["control_drop"] = float(np.mean(c_drops)) if c_drops else None
        trow["control_sd"] = float(np.std([trow["before"] - x for x in c_drops], ddof=1)) if len(c_drops) > 1 else None
        worst, wd = max(c_named, key=lambda rx: rx[1]) if c_named else (None, None)
        trow["worst_control"] = {"name": worst["name"], "tokens": worst["tokens"], "accuracy": worst["accuracy"][c],
                                 "drop": wd} if c_named else None
        test = stats.permutation_test(t_drops, c_drops, "greater", seed=seed + k) if t_drops and c_drops else {}
        trow["p"] = test.get("p")
        trow["p_exact"] = test.get("exact")
    for trow, adj in zip(table, stats.holm([trow["p"] for trow in table])):
        trow["p_holm"] = adj
        trow["beats_controls"] = None if adj is None else bool(adj <= alpha)
