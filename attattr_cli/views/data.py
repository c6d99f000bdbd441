"""What a view of one example shows, as plain numbers: the part every renderer shares.

:func:`build_view` reads an example by duck typing (the attributes docs/views.md, "In Python
and notebooks", lists) and returns a :class:`View`: the chosen layers and heads, the [query,
key] maps cut to what is readable, the causal mask, the shared colour scales, a token
importance, the top-k interactions and a header. numpy only: no torch, no matplotlib."""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from .. import convergence
from ..errors import OptionError
from ..labels import class_name, attributed, format_number, ranges  # noqa: F401  (format_number: re-exported)
from ..labels import example_labels

SHOWS = ("attr", "attention")
MAX_FULL = 64  # above this many tokens a view shows a window, never the n x n map
DEFAULT_WINDOW = 16
DEFAULT_TOP_K = 10
MAX_LAYERS = 6  # a picture of more scored layers shows these many, those that carry the most (ViewSpec.max_layers)
COLSUM = "attr-colsum"


@dataclass
class ViewSpec:
    """What to show: ``layers`` (stored layer numbers; negative count from ``num_layers``;
    None: all stored), ``heads`` ("sum", "all" or a head number), ``show`` (attr and/or
    attention), ``queries`` (query positions to centre a window on; None: the whole map
    when it has at most ``max_full`` tokens), ``window`` (query positions shown around each),
    ``top_k`` (rows of the interaction table), ``importance`` (a stored token importance
    method, or the attribution column sums), ``max_layers`` (without ``layers``, at most this
    many layers are drawn: those of largest total |attribution|, docs/views.md; None: every one)."""

    layers: Sequence[int] | None = None
    heads: str | int = "sum"
    show: Sequence[str] = SHOWS
    queries: Sequence[int] | None = None
    window: int = DEFAULT_WINDOW
    top_k: int = DEFAULT_TOP_K
    importance: str | None = None
    max_full: int = MAX_FULL
    num_layers: int | None = None
    max_layers: int | None = MAX_LAYERS


@dataclass
class View:
    index: int
    family: str
    keep: str
    query_tokens: list[str]
    key_tokens: list[str]
    q_idx: list[int]  # the query positions shown (rows)
    k_idx: list[int]  # the key positions shown (columns)
    layers: list[int]
    heads: list[str]  # "sum" or head numbers as strings
    maps: dict[str, np.ndarray]  # "attr" / "attention" -> [layer, head, query, key] (shown part)
    scale: dict[str, float]  # the colour scale's end for each map kind, shared by the figure
    masked: np.ndarray | None  # [query, key] True where a causal model cannot look
    importance: dict[str, Any]  # name, tokens, values (signed), description
    topk: list[dict]  # layer, head, query, key, query_token, key_token, value
    header: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    mode: str = "full"  # full | window | top-k
    query_pieces: list[str] = field(default_factory=list)  # the tokenizer's pieces behind the labels
    key_pieces: list[str] = field(default_factory=list)

    def to_json(self, digits: int = 4) -> dict:
        """Plain JSON values (maps rounded to ``digits`` significant digits) for the HTML views."""

        def r(a):
            a = np.asarray(a, dtype=np.float64)
            with np.errstate(divide="ignore", invalid="ignore"):
                m = np.where(a == 0, 0, np.floor(np.log10(np.abs(np.where(a == 0, 1, a)))))
            e = digits - 1 - m  # decimals to keep; dividing an integer by an exact power of ten keeps
            up, down = 10.0 ** np.maximum(e, 0), 10.0 ** np.maximum(-e, 0)  # JSON numbers short
            return np.where(e >= 0, np.round(a * up) / up, np.round(a / down) * down).tolist()

        return {
            "index": self.index, "family": self.family, "keep": self.keep, "mode": self.mode,
            "query_tokens": [self.query_tokens[i] for i in self.q_idx],
            "key_tokens": [self.key_tokens[j] for j in self.k_idx],
            "query_pieces": [self.query_pieces[i] for i in self.q_idx] if self.query_pieces else None,
            "key_pieces": [self.key_pieces[j] for j in self.k_idx] if self.key_pieces else None,
            "q_idx": self.q_idx, "k_idx": self.k_idx, "same_axis": self.query_tokens == self.key_tokens,
            "layers": self.layers, "heads": self.heads,
            "maps": {k: r(v) for k, v in self.maps.items()},
            "scale": self.scale,
            "masked": None if self.masked is None else self.masked.astype(int).tolist(),
            "importance": dict(self.importance, values=r(self.importance["values"])),
            "topk": [dict(t, value=float(f"{t['value']:.{digits}g}")) for t in self.topk],
            "header": self.header, "notes": self.notes,
        }


def lm_meta(example) -> dict | None:
    """A language model's ``meta["lm"]`` (None for a classifier)."""
    meta = getattr(example, "meta", None) or {}
    return meta.get("lm") if isinstance(meta, dict) else None


def header_of(example, labels: Sequence[str] | None = None) -> dict:
    """Text, gold label, prediction, what was attributed (:func:`attributed`), residual per layer;
    ``summary`` is the header's line of prediction, target and attributed quantity."""
    lm = lm_meta(example)
    pred, gold = int(example.pred), int(example.gold)
    a = attributed(example, labels)
    out: dict[str, Any] = {"index": int(example.index), "text_a": example.text_a or "", "text_b": example.text_b,
                           "family": getattr(example, "family", "self")}
    out.update({k: a[k] for k in ("prediction", "target", "probability", "probability_of", "foil",
                                  "foil_probability", "quantity", "step", "steps", "value")})
    out["attributed"] = a["line"]
    out["gold"] = None if lm or gold < 0 else class_name(labels, gold)
    parts = []
    if out["step"] is not None:
        parts.append(f"step {out['step']}" + (f" of {out['steps']}" if out["steps"] else "")
                     + f", after {len(example.tokens)} tokens")
    if out["gold"] is not None:
        parts.append(f"gold {out['gold']}")
    if lm and out["steps"] and out["step"] is None:
        parts.append(f"generated {out['target']}")
    else:
        p_pred = out["probability"] if (not lm or int(example.target) == pred) else None
        same = out["prediction"] == out["target"]
        parts.append(f"prediction{' and target' if same else ''} {out['prediction']}"
                     + (f" (p {p_pred:.3f})" if p_pred is not None and not same else ""))
        if not same:
            parts.append(f"target {out['target']}")
        if out["foil"] is not None:
            parts.append(f"foil {out['foil']}")
    parts.append(a["line"])
    out["summary"] = " · ".join(parts)
    out["correct"] = None if out["gold"] is None else gold == pred
    resid = np.asarray(getattr(example, "residual", []), dtype=np.float64).ravel()
    out["residual"] = {int(l): float(v) for l, v in zip(example.layers, resid)}
    # layers whose integral is not converged, with why ({} where all are, or the store predates the check)
    out["unconverged"] = convergence.unconverged_layers(example.layers, getattr(example, "convergence", None))
    out["truncated"] = bool(getattr(example, "truncated", False))
    return out


def _choose_layers(example, wanted, num_layers: int | None, summed=None,
                   max_layers: int | None = None) -> tuple[list[int], str | None]:
    """(the layers to draw, a note naming those left out or None). ``wanted`` None: every
    scored layer, or with more than ``max_layers`` the ``max_layers`` whose maps hold the
    largest total |attribution| (in layer order); "all": every scored layer; else the
    given layer numbers (negative ones count from ``num_layers``)."""
    scored = [int(x) for x in example.layers]
    if isinstance(wanted, str):
        if wanted != "all":
            raise OptionError(f"bad --layers '{wanted}': give layer numbers, a range such as 6:12, or all")
        return scored, None
    if wanted is None:
        if not max_layers or len(scored) <= max_layers or summed is None:
            return scored, None
        a = np.abs(np.nan_to_num(np.asarray(summed, dtype=np.float64)))
        rows = [int(p) for p in (lm_meta(example) or {}).get("positions") or [] if 0 <= int(p) < a.shape[1]]
        if rows:  # a language model: the queries that predict the target carry the answer
            weight, where = a[:, rows].sum(axis=(1, 2)), "in the rows of the positions that predict the target"
        else:
            weight, where = a.sum(axis=(1, 2)), "in their maps"
        best = sorted(int(i) for i in np.argsort(-weight, kind="stable")[:max_layers])
        chosen = [scored[i] for i in best]
        left = [l for l in scored if l not in chosen]
        share = float(weight[best].sum() / weight.sum()) if weight.sum() > 0 else 1.0
        note = (f"{len(scored)} layers scored; drawn: the {len(chosen)} with the largest total |attribution| {where}"
                f" (layers {', '.join(map(str, chosen))}: {share:.0%} of it); left out: {ranges(left)}"
                " (--layers all draws every layer, --layers 0,5 the ones named); the token importance and the"
                " top interactions cover every layer")
        return chosen, note
    total = num_layers or (max(scored) + 1 if scored else 0)
    out = []
    for layer in wanted:
        actual = layer + total if layer < 0 else layer
        if actual not in scored:
            raise OptionError(f"layer {layer} was not scored for example {example.index}; scored layers: "
                              + ", ".join(map(str, scored)))
        if actual not in out:
            out.append(actual)
    return out, None


def _heads(example, heads, n_heads: int | None) -> list[str]:
    if heads in (None, "sum"):
        return ["sum"]
    if n_heads is None:
        raise OptionError(
            f"example {example.index} keeps head sums only (scored with --keep {example.keep}): use --heads sum,"
            " or score it again with --keep maps for per-head maps")
    if heads == "all":
        return [str(h) for h in range(n_heads)]
    try:
        h = int(heads)
    except (TypeError, ValueError):
        raise OptionError(f"bad --heads '{heads}': use sum, all or a head number") from None
    if not 0 <= h < n_heads:
        raise OptionError(f"head {h} is out of range: the model has {n_heads} heads (0..{n_heads - 1})")
    return [str(h)]


def _per_head(arr, rows: list[int], heads: list[str], mean: bool) -> np.ndarray | None:
    """[layer, head-choice, q, k] from a 4D [L, H, q, k] or 3D (already summed/averaged) array."""
    if arr is None:
        return None
    a = np.asarray(arr)
    if a.ndim == 3:
        return a[rows][:, None] if heads == ["sum"] else None
    a = a[rows]
    if heads == ["sum"]:
        return (a.mean(axis=1) if mean else a.sum(axis=1))[:, None]
    return a[:, [int(h) for h in heads]]


def _causal(full: np.ndarray | None, same_axis: bool) -> bool:
    """A causal map has exact zeros everywhere above the diagonal (the model never looks ahead)."""
    if full is None or not same_axis or full.shape[-1] < 2:
        return False
    upper = np.triu(np.ones(full.shape[-2:], dtype=bool), 1)
    return bool(np.all(full[..., upper] == 0))


def _topk_rows(example, chosen_rows: list[int], layers: list[int], attr4, summed, k: int,
               qt: list[str], kt: list[str]) -> tuple[list[dict], str]:
    rows: list[dict] = []
    ti, tv = getattr(example, "topk_index", None), getattr(example, "topk_value", None)
    if ti is not None and tv is not None:
        ti, tv = np.asarray(ti), np.asarray(tv)
        for r, layer in zip(chosen_rows, layers):
            for h in range(tv.shape[1]):
                for e in range(tv.shape[2]):
                    rows.append({"layer": layer, "head": str(h), "query": int(ti[r, h, e, 0]),
                                 "key": int(ti[r, h, e, 1]), "value": float(tv[r, h, e])})
        how = "the stored top-k entries of every head"
    elif attr4 is not None or summed is not None:
        src = np.asarray(attr4)[chosen_rows] if attr4 is not None else np.asarray(summed)[chosen_rows][:, None]
        flat = np.abs(src.reshape(src.shape[0] * src.shape[1], -1))
        n_k = src.shape[-1]
        for lh in range(flat.shape[0]):
            best = np.argsort(-flat[lh], kind="stable")[:k]
            li, h = divmod(lh, src.shape[1])
            for b in best:
                q, key = divmod(int(b), n_k)
                rows.append({"layer": layers[li], "head": "sum" if attr4 is None else str(h), "query": q,
                             "key": key, "value": float(src[li, h, q, key])})
        how = "the largest |attribution| entries of " + ("every head" if attr4 is not None else "the head sums")
    else:
        return [], ""
    rows.sort(key=lambda t: (-abs(t["value"]), t["layer"], t["head"], t["query"], t["key"]))
    for t in rows:
        t["query_token"], t["key_token"] = qt[t["query"]], kt[t["key"]]
    return rows, how


def _window(example, causal: bool, summed: np.ndarray | None, topk: list[dict], spec: ViewSpec,
            nq: int, nk: int) -> tuple[list[int], list[int], list[int], str]:
    """Query rows around chosen positions and the keys they read most."""
    if spec.queries:
        centres = []
        for q in spec.queries:
            actual = q + nq if q < 0 else q
            if not 0 <= actual < nq:
                raise OptionError(f"query position {q} is out of range: example {example.index} has {nq} tokens"
                                  f" (0..{nq - 1})")
            centres.append(actual)
        why = "the chosen query positions"
    else:
        lm = lm_meta(example)
        if lm and lm.get("positions"):
            centres, why = [int(p) for p in lm["positions"]], "the positions that predict the target"
        elif summed is not None:
            centres, why = [int(np.argmax(np.abs(summed).sum(axis=(0, 2))))], "the query with the largest total |attribution|"
        elif topk:
            centres, why = [topk[0]["query"]], "the query of the strongest top-k entry"
        else:
            centres, why = [nq - 1], "the last position"
    size = max(spec.window, 1)
    q_set: set[int] = set()
    for c in centres:
        lo = max(0, min(c - size // 2, nq - size))
        q_set.update(range(lo, min(nq, lo + size)))
    q_idx = sorted(q_set)
    k_set = set(j for j in q_idx if j < nk)
    if summed is not None:
        reads = np.abs(summed[:, centres, :]).sum(axis=(0, 1))
        if causal:
            reads[max(centres) + 1:] = 0
        for j in np.argsort(-reads, kind="stable"):
            if len(k_set) >= spec.max_full or reads[j] == 0:
                break
            k_set.add(int(j))
    for t in topk:
        if len(k_set) < spec.max_full and t["query"] in q_set:
            k_set.add(t["key"])
    return q_idx, sorted(k_set), centres, why


def build_view(example, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
               token_importance: dict | None = None) -> View:
    """The :class:`View` of one example (see the module docstring); ``labels`` name the
    classes, ``token_importance`` ({method: [n]}) holds what ``faithfulness`` stored."""
    spec = spec or ViewSpec()
    show = list(spec.show)
    for s in show:
        if s not in SHOWS:
            raise OptionError(f"unknown --show '{s}'; available: {', '.join(SHOWS)}")
    scored = [int(x) for x in example.layers]
    ndim = np.ndim(example.attribution) if example.attribution is not None else None
    attr4 = example.attribution if ndim == 4 else None
    summed = getattr(example, "head_sum", None)
    if summed is None and ndim == 4:
        summed = np.asarray(attr4).sum(axis=1)
    elif summed is None and ndim == 3:
        summed = np.asarray(example.attribution)
    layers, layer_note = _choose_layers(example, spec.layers, spec.num_layers, summed, spec.max_layers)
    rows = [scored.index(l) for l in layers]
    compact = layer_note is not None
    attention = getattr(example, "attention", None)
    q_pieces = [str(t) for t in example.tokens]
    k_pieces = [str(t) for t in (getattr(example, "key_tokens", None) or example.tokens)]
    qt, kt = example_labels(example)  # decoded, spaces and line breaks marked (labels.py)
    nq, nk = len(qt), len(kt)
    notes: list[str] = []
    keep = str(getattr(example, "keep", "maps"))
    if summed is None and getattr(example, "topk_index", None) is None:
        raise OptionError(
            f"example {example.index} keeps no attribution maps, head sums or top-k entries (scored with --keep {keep}"
            + (": its source scores are in to_pandas('sources'), drawn by plot_sources()" if keep == "sources"
               else " and no --top-k")
            + "): score it again with --keep sum or --keep maps to view it")
    n_heads = int(np.shape(attr4)[1]) if attr4 is not None else None
    heads = _heads(example, spec.heads, n_heads) if summed is not None else ["sum"]

    maps: dict[str, np.ndarray] = {}
    if summed is not None and "attr" in show:
        maps["attr"] = _per_head(attr4 if attr4 is not None else summed, rows, heads, mean=False)
    if "attention" in show:
        if attention is None:
            if show != list(SHOWS):
                raise OptionError(f"example {example.index} keeps no attention (scored with --keep {keep}):"
                                  " use --show attr")
            notes.append("no attention is stored for this example")
        else:
            # attention may hold every layer while attribution holds the scored ones
            att_rows = rows if np.shape(attention)[0] == len(scored) else layers
            att = _per_head(attention, att_rows, heads, mean=True)
            if att is None:
                raise OptionError(f"example {example.index} keeps the head-mean attention only: use --heads sum")
            maps["attention"] = att
    full_maps = summed if summed is not None else (np.asarray(attention) if attention is not None else None)
    causal = _causal(full_maps, qt == kt)
    every_rows = list(range(len(scored))) if compact else rows  # the table and the strip: every layer
    every_topk, topk_how = _topk_rows(example, every_rows, scored if compact else layers, attr4, summed, spec.top_k,
                                      qt, kt)
    topk = every_topk[:spec.top_k]

    if summed is None:
        mode, q_idx, k_idx = "top-k", [], []
        notes.append(f"example {example.index} was scored with --keep {keep}: no maps are stored; the table shows"
                     f" {topk_how}")
    elif spec.queries or nq > spec.max_full or nk > spec.max_full:
        mode = "window"
        q_idx, k_idx, centres, why = _window(example, causal, np.asarray(summed)[rows], topk, spec, nq, nk)
        notes.append(
            f"{nq} query and {nk} key tokens are too many for one readable map: shown are query positions "
            f"{q_idx[0]}..{q_idx[-1]} (a window of {spec.window} around {why}: {', '.join(map(str, centres))}) and "
            f"the {len(k_idx)} keys they read most or sit beside; choose others with --queries")
    else:
        mode, q_idx, k_idx = "full", list(range(nq)), list(range(nk))
    maps = {k: np.asarray(v, dtype=np.float64)[:, :, q_idx][:, :, :, k_idx] for k, v in maps.items()} if q_idx else {}
    masked = None
    if causal and q_idx:
        masked = np.asarray(k_idx)[None, :] > np.asarray(q_idx)[:, None]
        notes.append("causal model: cells above the diagonal (a token looking ahead) are masked, not zero")
    scale = {}
    for k, v in maps.items():
        vals = v if masked is None else v[..., ~masked]
        top = float(np.max(np.abs(vals))) if vals.size else 0.0
        scale[k] = top if top > 0 else 1.0

    importance = _importance(example, spec, token_importance, summed, every_topk, every_rows, kt,
                             "every scored layer" if compact else "the shown layers")
    if compact:
        notes.insert(0, layer_note)
    head_text = "the sum over heads" if heads == ["sum"] else ("every head" if len(heads) > 1 else f"head {heads[0]}")
    if maps:
        what = []
        if "attr" in maps:
            what.append(f"attribution ({head_text}; diverging scale centred at 0, shared: ±{scale['attr']:.3g})")
        if "attention" in maps:
            att_text = "the mean over heads" if heads == ["sum"] else head_text
            what.append(f"attention ({att_text}; sequential scale 0..{scale['attention']:.3g}, shared)")
        notes.insert(0, "maps: rows are queries, columns keys; " + "; ".join(what))
    if topk_how and topk:
        notes.append(f"top-{len(topk)} interactions: {topk_how}, by |value|")
    return View(index=int(example.index), family=str(getattr(example, "family", "self")), keep=keep,
                query_tokens=qt, key_tokens=kt, q_idx=q_idx, k_idx=k_idx, layers=layers, heads=heads, maps=maps,
                scale=scale, masked=masked, importance=importance, topk=topk, header=header_of(example, labels),
                notes=notes, mode=mode, query_pieces=q_pieces, key_pieces=k_pieces)


def _importance(example, spec: ViewSpec, stored: dict | None, summed, topk, rows, kt,
                over: str = "the shown layers") -> dict:
    stored = stored or {}
    if spec.importance not in (None, COLSUM):
        if spec.importance not in stored:
            have = ", ".join([COLSUM, *stored])
            raise OptionError(f"example {example.index} has no token importance '{spec.importance}'; it has: {have}"
                              " (others come from `attattr faithfulness` on the store)")
        values = np.asarray(stored[spec.importance], dtype=np.float64)
        from ..labels import example_labels

        tokens = example_labels(example)[0]
        if len(values) != len(tokens):
            tokens = kt
        return {"name": spec.importance, "tokens": tokens, "values": values,
                "description": f"token importance '{spec.importance}' stored by faithfulness"}
    if summed is not None:
        values = np.asarray(summed, dtype=np.float64)[rows].sum(axis=(0, 1))
        return {"name": COLSUM, "tokens": kt, "values": values,
                "description": f"attribution column sums: what each token gives, summed over queries, heads and"
                               f" {over}"}
    values = np.zeros(len(kt))
    for t in topk:
        values[t["key"]] += t["value"]
    return {"name": "top-k column sums", "tokens": kt, "values": values,
            "description": "the top-k entries summed per key token (no maps stored)"}


# -- the maps' compact form in the HTML page's JSON --------------------------------------------
def pack(values) -> dict:
    """[layer, head, query, key] values as little-endian float16 in base64, scaled by a power of
    two (exact) so the largest |value| sits near 2**14: 3 significant digits (docs/views.md).
    NaN and infinities stay non-finite (the script reads them as null)."""
    a = np.asarray(values, dtype=np.float64)
    finite = np.abs(a[np.isfinite(a)])
    top = float(finite.max()) if finite.size else 0.0
    exp = 14 - int(np.floor(np.log2(top))) if top > 0 else 0
    half = (a * 2.0 ** exp).astype("<f2")
    return {"f16": base64.b64encode(half.tobytes()).decode("ascii"), "exp": exp, "shape": list(a.shape)}


def unpack(packed) -> np.ndarray:
    """The values of :func:`pack` (a list passes through as an array)."""
    if not isinstance(packed, dict):
        return np.asarray(packed, dtype=np.float64)
    raw = np.frombuffer(base64.b64decode(packed["f16"]), dtype="<f2").astype(np.float64)
    return (raw * 2.0 ** -packed["exp"]).reshape(packed["shape"])
