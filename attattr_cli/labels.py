"""Readable labels for tokens: the one place every view and table turns a tokenizer's pieces
(``Ġcapital``, ``▁the``, ``<0x0A>``, ``##ing``) into the text a reader sees (docs/views.md, "Token
labels", has the rules with examples).

A label is the piece decoded to its text, byte-level BPE as UTF-8 over the whole sequence (a
character split across tokens is named in each with its part, ``Ф(1/2)``), with what cannot be seen
made visible: ``␣`` a space at either end (inside, a space stays), ``↵``, ``⇥``, ``<0x07>``, ``∅``.
:func:`attributed` names what an example's attribution explains (the quantity F, its value, target,
foil, prediction), :func:`format_number` the number format of every view. numpy only: no torch, no
printing.
"""

from __future__ import annotations

import itertools
import re
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

SPACE, NEWLINE, TAB, EMPTY = "␣", "↵", "⇥", "∅"
BPE_SPACE, SP_SPACE, WORDPIECE = "Ġ", "▁", "##"
SPECIAL = re.compile(r"^(\[[A-Za-z_]+\]|<[^<>\s]+>|<\|[^|]+\|>)$")
_SP_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_SHOWN = {"\n": NEWLINE, "\r": "", "\t": TAB}  # other control characters: <0x07>


@lru_cache(maxsize=1)
def _byte_table() -> tuple[dict[str, int], dict[int, str]]:
    """GPT-2's byte <-> printable character table (byte-level BPE writes bytes as these)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    to_byte = {chr(c): b for b, c in zip(bs, cs)}
    return to_byte, {b: ch for ch, b in to_byte.items()}


def _bytes_of(piece: str) -> bytes | None:
    """The bytes a byte-level piece stands for (None: a character outside the table)."""
    table = _byte_table()[0]
    try:
        return bytes(table[c] for c in piece)
    except KeyError:
        return None


def style_of(tokens: Sequence[str]) -> str:
    """How ``tokens`` (one sequence) are written: "bytes" (byte-level BPE: GPT-2, Llama 3,
    SmolLM, Qwen), "sentencepiece" (``▁``), "wordpiece" (``##``) or "text" (plain text:
    words already decoded, or pieces whose decoding changes nothing)."""
    pieces = [str(t) for t in tokens if not SPECIAL.match(str(t))]
    if any(t.startswith(WORDPIECE) and len(t) > 2 for t in pieces):
        return "wordpiece"
    if any(SP_SPACE in t or _SP_BYTE.search(t) for t in pieces):
        return "sentencepiece"
    if not any(ord(c) > 126 or c == " " for t in pieces for c in t):
        return "text"  # ASCII without spaces: every reading gives the same text
    raw = [_bytes_of(t) for t in pieces]
    if any(b is None for b in raw):
        return "text"
    if any(any(0x100 <= ord(c) <= 0x143 for c in t) for t in pieces):
        return "bytes"  # Ġ, Ċ, ... only byte-level BPE writes these
    try:  # Latin-1 letters only: byte-level when together they are UTF-8 ("Ã©" is "é")
        b"".join(raw).decode("utf-8")
        return "bytes"
    except UnicodeDecodeError:
        return "text"


def visible(text: str) -> str:
    """``text`` with what cannot be seen made visible: a space at either end ``␣``, line
    breaks ``↵``, tabs ``⇥``, other control characters ``<0x07>``; empty: ``∅``."""
    if text == "":
        return EMPTY
    core = text.strip(" ")
    lead = len(text) - len(text.lstrip(" "))
    trail = len(text) - len(text.rstrip(" ")) if core else 0
    core = _CONTROL.sub(lambda m: _SHOWN.get(m.group(), f"<0x{ord(m.group()):02X}>"), core)
    return SPACE * lead + core + SPACE * trail or EMPTY


def _sp_text(piece: str) -> str:
    if _SP_BYTE.fullmatch(piece):
        b = int(piece[3:5], 16)
        return chr(b) if b < 128 else piece
    return piece.replace(SP_SPACE, " ")


def _byte_texts(tokens: Sequence[str]) -> list[str]:
    """Each byte-level piece's text, decoded over the whole sequence (see the module docstring)."""
    chunks = [None if SPECIAL.match(t) else _bytes_of(t) for t in map(str, tokens)]
    out = [str(t) if c is None else "" for t, c in zip(tokens, chunks)]
    for is_bytes, run in itertools.groupby(range(len(chunks)), key=lambda i: chunks[i] is not None):
        if not is_bytes:
            continue
        # the bytes of each run of byte pieces, with the token each byte came from
        run = list(run)
        owner = [j for j in run for _ in chunks[j]]
        k = 0
        # a byte that is no UTF-8 decodes to a lone surrogate U+DC80..U+DCFF
        for ch in b"".join(chunks[j] for j in run).decode("utf-8", "surrogateescape"):
            if "\udc80" <= ch <= "\udcff":
                out[owner[k]] += f"<0x{ord(ch) - 0xDC00:02X}>"
                k += 1
                continue
            length = len(ch.encode("utf-8"))
            holders = sorted(set(owner[k:k + length]))
            if len(holders) == 1:
                out[holders[0]] += ch
            else:
                for part, h in enumerate(holders, 1):
                    out[h] += f"{ch}({part}/{len(holders)})"
            k += length
    return out


def texts(tokens: Sequence[str], style: str | None = None) -> list[str]:
    """The text of each token of one sequence (spaces and line breaks as they are; see
    :func:`visible`); ``style`` as :func:`style_of` tells (default: from these tokens)."""
    tokens = [str(t) for t in tokens]
    style = style or style_of(tokens)
    if style == "bytes":
        return _byte_texts(tokens)
    if style == "sentencepiece":
        return [t if SPECIAL.match(t) and not _SP_BYTE.fullmatch(t) else _sp_text(t) for t in tokens]
    return list(tokens)


def token_labels(tokens: Sequence[str], style: str | None = None) -> list[str]:
    """The label of each token of one sequence: its text made visible (the module docstring)."""
    return [visible(t) for t in texts(tokens, style)]


def token_label(token: str, style: str | None = None) -> str:
    """The label of one token seen alone (a prediction, a target, a foil)."""
    return token_labels([token], style)[0]


def text_of(tokens: Sequence[str], style: str | None = None) -> str:
    """The text of consecutive tokens as one string (decoded together: a character split
    over them is whole again); WordPiece's ``##`` joins, other WordPiece tokens are spaced."""
    tokens = [str(t) for t in tokens]
    style = style or style_of(tokens)
    if style == "bytes":
        parts, run = [], []
        for t in tokens + [None]:
            if t is not None and not SPECIAL.match(t) and _bytes_of(t) is not None:
                run.append(_bytes_of(t))
                continue
            if run:
                parts.append(b"".join(run).decode("utf-8", "replace"))
                run = []
            if t is not None:
                parts.append(t)
        return "".join(parts)
    if style == "wordpiece":
        out = ""
        for i, t in enumerate(tokens):
            out += t[2:] if t.startswith(WORDPIECE) else (" " if i else "") + t
        return out
    return "".join(texts(tokens, style))


def example_style(example) -> str:
    """The style of an example's tokens: "text" for tokens already merged into words (an
    aggregated example holds decoded text), else :func:`style_of` of its tokens."""
    meta = getattr(example, "meta", None)
    if isinstance(meta, dict) and meta.get("aggregate"):
        return "text"
    return style_of(list(getattr(example, "tokens", []) or []) + list(getattr(example, "key_tokens", None) or []))


def example_labels(example) -> tuple[list[str], list[str]]:
    """(query labels, key labels) of an example: its tokens and key tokens as a reader sees them."""
    style = example_style(example)  # "text": each token as it is, made visible
    q = [str(t) for t in example.tokens]
    return token_labels(q, style), token_labels(getattr(example, "key_tokens", None) or q, style)


def class_name(labels: Sequence[str] | None, i: int) -> str:
    if labels and 0 <= i < len(labels):
        return str(labels[i])
    return str(i)


def ranges(values) -> str:
    """Layer numbers as runs: [0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    runs: list[list[int]] = []
    for v in sorted(int(x) for x in values):
        if runs and runs[-1][1] == v - 1:
            runs[-1][1] = v
        else:
            runs.append([v, v])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def format_number(v, signed: bool = False) -> str:
    """The one number format of every view (PNG, SVG, HTML, the report; view.js's fmt is the
    same): three significant digits, scientific below 1e-3 and from 1e4 (6.19e-4), trailing
    zeros dropped; ``signed`` puts + before positive numbers."""
    import math

    if v is None or not math.isfinite(float(v)):
        return "n/a"
    v = float(v)
    a = abs(v)
    if a == 0:
        text = "0"
    elif a < 1e-3 or a >= 1e4:
        mantissa, exponent = f"{v:.2e}".split("e")
        text = f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"
    else:
        text = f"{v:.{max(0, 2 - math.floor(math.log10(a) + 1e-12))}f}"
        if "." in text:
            text = text.rstrip("0").rstrip(".")
    return ("+" if signed and v > 0 else "") + text


OUTPUT_NAMES = {"prob": "p", "logprob": "log p", "logit": "logit"}


def _quantity(output: str | None, what: str) -> str:
    return f"{OUTPUT_NAMES.get(output or '', 'F')}({what})"


def attributed(example, labels: Sequence[str] | None = None) -> dict:
    """What was attributed, by name and value (the one wording of every view, table and
    ``repr``): ``quantity`` ("p(␣Paris) − p(␣London)"), ``value`` (F at the input, the stored
    ``f_full``), the ``target`` and ``foil`` labels, their probabilities, the ``prediction``
    and, for a generation's step, ``step`` and ``steps``; ``line`` says it all in one line."""
    meta = getattr(example, "meta", None)
    meta = meta if isinstance(meta, dict) else {}
    lm = meta.get("lm")
    probs = np.asarray(getattr(example, "probs", []), dtype=np.float64).ravel()
    value = float(getattr(example, "f_full", float("nan")))
    out: dict[str, Any] = {"value": value, "foil": None, "foil_probability": None, "step": None, "steps": None}
    if lm:
        style = example_style(example)
        style = None if style == "text" else style  # None: each label's own style
        output = lm.get("output") or "prob"
        names = [str(t) for t in lm.get("target_tokens") or []]
        target = visible(text_of(names, style)) if names else str(int(example.target))
        pred = lm.get("predicted_token")
        p = float(np.prod(probs)) if probs.size else None
        out.update(prediction=token_label(str(pred), style) if pred is not None else str(int(example.pred)),
                   target=target, probability=p, probability_of=f"p({target})", target_probability=p)
        foil = lm.get("foil_token")
        if foil is not None:
            out["foil"] = token_label(str(foil), style)
            fp = [float(x) for x in lm.get("foil_probs") or []]
            out["foil_probability"] = float(np.prod(fp)) if fp else None
        if getattr(example, "steps", None):  # a whole generation: the sum of its steps' F
            n = len(example.steps)
            each = _quantity(output, "token") + ("" if foil is None else " − " + _quantity(output, out["foil"]))
            out.update(quantity=f"Σ over the {n} steps of {each} (given the tokens before it)", steps=n,
                       probability=None, probability_of=None, target_probability=None)
        else:
            n_pos = max(len(names), 1)
            summed = output == "logit" and n_pos > 1  # the logits of several positions, summed
            q = ("Σ logit(" + ", ".join(token_label(t, style) for t in names) + ")" if summed
                 else _quantity(output, target))
            if foil is not None:
                f = out["foil"] + ("" if n_pos == 1 else f" at each of the {n_pos} positions")
                q += " − " + ("Σ logit(" + f + ")" if summed else _quantity(output, f))
            out["quantity"] = q
            step = meta.get("step")
            if isinstance(step, dict):
                out["step"] = int(step.get("step", 0))
                out["steps"] = int(step.get("of", 0)) or None
    else:
        output = getattr(example, "output", None)
        pred, target = int(example.pred), int(example.target)
        out["prediction"] = class_name(labels, pred)
        out["target"] = class_name(labels, target)
        out["probability"] = float(probs[pred]) if 0 <= pred < probs.size else None
        out["probability_of"] = f"p({out['prediction']})"
        out["target_probability"] = float(probs[target]) if 0 <= target < probs.size else None
        foil = meta.get("foil")
        q = _quantity(output, out["target"])
        if isinstance(foil, dict):
            idx = int(foil.get("index", -1))
            out["foil"] = class_name(labels, idx) if labels else str(foil.get("label", idx))
            out["foil_probability"] = float(probs[idx]) if 0 <= idx < probs.size else None
            q += " − " + _quantity(output, out["foil"])
        out["quantity"] = q
    out["line"] = attributed_line(out)
    return out


def attributed_line(a: dict) -> str:
    """"attributed F = p(␣Paris) − p(␣London) = 0.76 · p(␣Paris) 0.773 · p(␣London) 0.0125"."""
    line = f"attributed F = {a['quantity']} = {format_number(a['value'])}"
    tp = a.get("target_probability")
    if tp is not None and a["quantity"] != f"p({a['target']})":
        line += f" · p({a['target']}) {format_number(tp)}"
    if a.get("foil") is not None and a.get("foil_probability") is not None:
        line += f" · p({a['foil']}) {format_number(a['foil_probability'])}"
    return line


