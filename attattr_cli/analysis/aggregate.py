"""Subword tokens merged into words (or user spans): the ``aggregate`` step.

A merge is a list of groups, each a run of consecutive token positions. A map over tokens
[..., query, key] becomes a map over groups by **summing** over the merged queries and keys,
Attr'(I, J) = sum_{i in I, j in J} Attr(i, j) (completeness kept); token-importance vectors
sum the same way; attention is summed over merged keys and averaged over merged queries
(rows still sum to 1). Words come from ``word_ids`` (a fast tokenizer's
``encoding.word_ids()``: one word index per token, None for special tokens) or else from the
tokens' markers (``##``, ``Ġ``, ``▁``); user spans are (start, end) pairs, end exclusive.
docs/views.md, "Words and spans"; the analyses' use: docs/faithfulness.md, "Words" and
docs/triggers.md, "Extraction".
"""

from __future__ import annotations

import dataclasses
import numbers
import re
import string

import numpy as np

from ..errors import OptionError

BPE_SPACE, SP_SPACE, WORDPIECE = "Ġ", "▁", "##"
_SPECIAL = re.compile(r"^(\[[A-Z]+\]|<[^<>]+>|<\|[^|]+\|>)$")
_PUNCT = set(string.punctuation) | set("“”‘’«»…–—")
_BREAKS = set("Ċĉ\n\t")  # byte-level BPE's line break and tab, and the characters


def _starts_word(token: str, style: str) -> bool:
    if style == "wordpiece":
        return not token.startswith(WORDPIECE)
    marker = BPE_SPACE if style == "bpe" else SP_SPACE
    return token.startswith(marker) or token.startswith("Ċ") or token.startswith("\n")


def word_style(tokens: list[str]) -> str:
    """How a tokenizer marks words in these tokens: "wordpiece" (##, also where nothing is marked), "sentencepiece" (▁) or "bpe" (Ġ)."""
    if any(t.startswith(WORDPIECE) for t in tokens):
        return "wordpiece"
    if any(t.startswith(SP_SPACE) for t in tokens):
        return "sentencepiece"
    if any(t.startswith(BPE_SPACE) for t in tokens):
        return "bpe"
    return "wordpiece"  # no marker at all: every token is a word


def _alone(tok: str) -> bool:
    """A special token, punctuation alone or a line break alone: a word of its own."""
    return bool(_SPECIAL.match(tok)) or bool(tok) and (all(c in _PUNCT for c in tok) or set(tok) <= _BREAKS)


def _runs(labels: list) -> list[list[int]]:
    """Consecutive positions with the same label grouped (a position labelled None alone)."""
    groups: list[list[int]] = []
    for i, w in enumerate(labels):
        if w is not None and groups and labels[i - 1] == w:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def word_groups(tokens: list[str], word_ids: list | None = None) -> list[list[int]]:
    """Consecutive token positions grouped into words (see the module docstring)."""
    if word_ids is not None:
        if len(word_ids) != len(tokens):
            raise OptionError(f"word_ids has {len(word_ids)} entries for {len(tokens)} tokens")
        return _runs(word_ids)
    style = word_style(tokens)
    groups = []
    for i, tok in enumerate(tokens):
        if not groups or _alone(tok) or _alone(tokens[i - 1]) or _starts_word(tok, style):
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


def span_groups(n: int, spans) -> list[list[int]]:
    """Groups of ``n`` tokens from user spans ((start, end), end exclusive; the others alone)."""
    taken = [None] * n
    try:
        given = list(spans)
    except TypeError:
        raise OptionError(f"spans are a list of (start, end) pairs, got {spans!r}") from None
    pairs = []
    for span in given:
        # whole numbers only: a float end (2.7) or a bool (True) would be cut to another token silently
        if (isinstance(span, (str, bytes)) or not hasattr(span, "__len__") or len(span) != 2
                or not all(isinstance(x, numbers.Integral) and not isinstance(x, (bool, np.bool_)) for x in span)):
            raise OptionError(f"a span is (start, end), two whole numbers, got {span!r}")
        pairs.append((int(span[0]), int(span[1])))
    for k, (start, end) in enumerate(sorted(pairs)):
        if not 0 <= start < end <= n:
            raise OptionError(f"span ({start}, {end}) is outside the {n} tokens (end exclusive)")
        if any(t is not None for t in taken[start:end]):
            raise OptionError(f"span ({start}, {end}) overlaps another span")
        taken[start:end] = [k] * (end - start)
    return _runs(taken)


def word_text(tokens: list[str], style: str | None = None) -> str:
    """The text of merged tokens as a reader would write it (markers removed, byte-level BPE
    decoded: labels.text_of); ``style`` is the tokenizer's (from the whole sequence; default:
    from these tokens), as :func:`word_style` names it."""
    from ..labels import style_of, text_of

    decoding = style_of(tokens)
    if (style or word_style(tokens)) == "wordpiece" and decoding != "bytes":
        decoding = "wordpiece"
    out = text_of(tokens, decoding)
    return out.strip(" ") or out


def membership(groups: list[list[int]], n: int) -> np.ndarray:
    """[groups, n] 0/1 matrix: P[g, i] = 1 when token i is in group g."""
    p = np.zeros((len(groups), n), np.float64)
    for g, idx in enumerate(groups):
        p[g, idx] = 1.0
    return p


def merge_map(a: np.ndarray | None, p_q: np.ndarray, p_k: np.ndarray, mean_queries: bool = False):
    """[..., q, k] -> [..., Q, K]: summed over merged queries and keys (queries averaged with
    ``mean_queries``, for attention probabilities)."""
    if a is None:
        return None
    a = np.asarray(a)
    pq = p_q / p_q.sum(1, keepdims=True) if mean_queries else p_q
    out = np.einsum("Qq,...qk,Kk->...QK", pq, a.astype(np.float64), p_k)
    return out.astype(a.dtype)


def merge_vector(v: np.ndarray | None, p: np.ndarray):
    return None if v is None else (p @ np.asarray(v, np.float64)).astype(np.asarray(v).dtype)


def words_asked(aggregate) -> bool:
    """The ``aggregate`` argument of the analyses (triggers, faithfulness, token tables):
    True for "words", False for None or "tokens" (as scored); anything else is refused."""
    if aggregate is None or aggregate == "tokens":
        return False
    if aggregate == "words":
        return True
    raise OptionError(f"unknown aggregate '{aggregate}'; use words or tokens")


def groups_of(tokens: list[str], how="words", word_ids=None) -> list[list[int]]:
    """The merge ``how`` asks for over ``tokens``: "words" (``word_ids`` optional), "tokens"
    (each token alone) or a list of (start, end) spans."""
    if isinstance(how, str):
        if how not in ("words", "tokens"):
            raise OptionError(f"unknown aggregation '{how}'; use words, tokens or a list of (start, end) spans")
        return word_groups(tokens, word_ids) if how == "words" else [[i] for i in range(len(tokens))]
    return span_groups(len(tokens), how)


def token_keep(keep: np.ndarray, groups: list[list[int]], n: int) -> np.ndarray:
    """A keep-mask over ``n`` tokens from one over ``groups`` (bool [groups]): a token is kept
    when its group is, so erasing a word erases every piece of it."""
    out = np.ones(n, dtype=bool)
    for g, idx in enumerate(groups):
        if not keep[g]:
            out[idx] = False
    return out


def aggregate_example(example, how="words", word_ids=None):
    """A copy of a StoredExample (or Attribution) over words or spans: ``how`` "words"
    (``word_ids`` optional) or a list of (start, end) spans; maps, head sums, attention, head
    maxima and top-k follow (see the module docstring), per-step results too."""
    tokens = list(example.tokens)
    n = len(tokens)
    if isinstance(how, str) and how == "tokens":
        return example
    groups = groups_of(tokens, how, word_ids)
    p = membership(groups, n)
    keys = list(example.key_tokens or tokens)
    p_k = p if keys == tokens else np.eye(len(keys))
    key_groups = groups if keys == tokens else [[j] for j in range(len(keys))]
    attribution = merge_map(example.attribution, p, p_k)
    head_sum = merge_map(example.head_sum, p, p_k)
    attention = merge_map(example.attention, p, p_k, mean_queries=True)
    head_max = example.head_max
    if attribution is not None and np.ndim(attribution) == 4:
        head_max = attribution.reshape(*attribution.shape[:2], -1).max(-1).astype(np.float32)
    first = [g[0] for g in groups]
    style = word_style(tokens)
    words = [word_text([tokens[i] for i in g], style) for g in groups]
    meta = dict(example.meta)
    meta["aggregate"] = {"how": how if isinstance(how, str) else "spans", "groups": groups}
    changes = dict(
        tokens=words, key_tokens=[word_text([keys[j] for j in g], style) for g in key_groups],
        input_ids=np.asarray(example.input_ids)[first], segment_ids=np.asarray(example.segment_ids)[first],
        attribution=attribution, head_sum=head_sum, attention=attention, head_max=head_max,
        topk_index=None, topk_value=None, meta=meta)
    steps = getattr(example, "steps", None)
    if steps:
        changes["steps"] = [aggregate_example(st, how, None if word_ids is None else word_ids[:len(st.tokens)])
                            for st in steps]
    return dataclasses.replace(example, **changes)


def step_source(example, words: bool = True):
    """The step x source matrix of a generation: rows the generated tokens (or words), columns
    the tokens (or words) of the sequence, entry = the step's token importance of the column
    (its attribution summed over layers, heads and queries), NaN where the column is not in the
    step's prefix. Returns (matrix [rows, columns], row labels, column labels, per-row target
    output f_full, per-layer matrices [layers, rows, columns])."""
    steps = getattr(example, "steps", None)
    if not steps:
        raise OptionError(f"example {example.index} is not a generation scored step by step"
                          " (score it with --generate N or --continuation TEXT --per-step)")
    tokens = list(example.tokens)
    targets = [st.meta["step"]["target_token"] for st in steps]
    full = tokens + [targets[-1]]  # every token: the sequence read and the last generated one
    n = len(tokens)
    layers = len(steps[0].layers)
    per = np.full((len(steps), layers, n), np.nan)
    for t, st in enumerate(steps):
        m = st.summed() if st.attribution is not None or st.head_sum is not None else None
        if m is None:
            raise OptionError(f"example {example.index} keeps no maps (scored with --keep {getattr(st, 'keep', None) or 'none'}):"
                              " no step x source view")
        per[t, :, :len(st.tokens)] = np.asarray(m, np.float64).sum(axis=1)  # [layers, keys]
    f_rows = np.asarray([st.f_full for st in steps])
    p_len = n - len(steps) + 1  # the prompt's tokens
    if words:
        col_groups = word_groups(full)
        # rows: generated tokens grouped by the words they belong to (a word of the prompt's
        # last token continued by the first generated token starts its row at that token)
        row_groups = [steps_in for g in col_groups if (steps_in := [i - p_len for i in g if i >= p_len])]
    else:
        col_groups = [[j] for j in range(len(full))]
        row_groups = [[t] for t in range(len(steps))]
    cols = membership(col_groups, len(full))[:, :n]  # the last generated token is no source
    keep_cols = cols.sum(1) > 0
    cols, col_groups = cols[keep_cols], [g for g, k in zip(col_groups, keep_cols) if k]
    rows = membership(row_groups, len(steps))
    filled = np.nan_to_num(per)
    by_layer = np.einsum("Rt,tlk,Ck->lRC", rows, filled, cols)
    seen = np.einsum("Rt,tk,Ck->RC", rows, (~np.isnan(per[:, 0])).astype(float), cols) > 0
    by_layer[:, ~seen] = np.nan
    matrix = by_layer.sum(0) if layers else np.zeros(seen.shape)
    matrix[~seen] = np.nan
    style = word_style(full)
    if words:
        row_labels = [word_text([targets[t] for t in g], style) for g in row_groups]
        col_labels = [word_text([full[j] for j in g], style) for g in col_groups]
    else:  # each token's text, decoded in its sequence (labels.texts: a split character named in each part)
        from ..labels import texts

        each = texts(full)
        row_labels = [each[p_len + t] for t in range(len(steps))]
        col_labels = [each[j] for j in range(n)]
    return matrix, row_labels, col_labels, rows @ f_rows, by_layer
