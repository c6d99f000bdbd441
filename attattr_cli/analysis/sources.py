"""Sources: a long prompt's keys grouped into sentences, paragraphs or given passages.

A source is a span of consecutive token positions (start, end), end exclusive, as the spans of
analysis/aggregate.py. They are found in the prompt's text and mapped to tokens by the
tokenizer's character offsets:

* ``paragraphs``: the text split on blank lines (a line holding only white space ends a
  paragraph);
* ``sentences``: the text split after ``.``, ``!`` or ``?`` (with any closing quotes or
  brackets) followed by white space, and on blank lines;
* a JSONL file: one passage per line, its text in the field ``text`` (or ``FILE:FIELD`` for
  another field); each passage is found in the prompt in order, after the one before.

A token belongs to the source its first character lies in; tokens in no source (the chat
template, the question after the passages, special tokens) belong to none and are not listed.

A source's **score** is the sum of its keys' attribution over every scored layer, every head
and every query row: sum_{l, h, i} Attr_l,h(i, j) summed over the source's keys j. For
``continuation=...`` (F the answer's joint probability or log-probability) this is the share
of F(A) - F(0) that flows through attention to the source's tokens, per layer, added over the
layers, as ContextCite scores sources for the same F. For a generation the score is summed
over the steps (F = sum_t F_t) and each step's own score is given beside it.

Torch-free: the scorer asks :func:`token_spans` for an example's spans, the readers
:func:`source_rows` for the table.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from ..errors import DataError, OptionError

KINDS = ("sentences", "paragraphs")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")


def check_spec(spec) -> None:
    """A ``--sources`` value is sentences, paragraphs or an existing JSONL file (FILE or
    FILE:FIELD): OptionError/DataError otherwise, before anything loads."""
    if spec is None or spec in KINDS:
        return
    if not isinstance(spec, str):
        raise OptionError(f"--sources must be sentences, paragraphs or a JSONL file, got {spec!r}")
    path, _field = _file_and_field(spec)
    if not path.exists():
        raise DataError(f"--sources {spec}: no such file (give sentences, paragraphs or a JSONL file of passages)")


def _file_and_field(spec: str) -> tuple[Path, str]:
    path = Path(spec)
    if not path.exists() and ":" in spec:
        head, field = spec.rsplit(":", 1)
        if Path(head).exists() and field:
            return Path(head), field
    return path, "text"


def passages(spec: str) -> list[str]:
    """The passages of a JSONL file (one object a line, the text in ``field``)."""
    path, field = _file_and_field(spec)
    out = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"--sources {spec}: cannot read it ({exc})") from None
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(f"--sources {path}: line {i} is not JSON ({exc.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get(field), str):
            raise DataError(f"--sources {path}: line {i} has no text field '{field}'")
        out.append(row[field])
    if not out:
        raise DataError(f"--sources {path}: no passages")
    return out


def char_spans(text: str, spec: str) -> list[tuple[int, int]]:
    """The sources of ``text`` as character spans (start, end), white space trimmed."""
    if spec == "paragraphs":
        cuts = [(m.start(), m.end()) for m in _PARAGRAPH.finditer(text)]
    elif spec == "sentences":
        cuts = sorted({(m.start(), m.end()) for rx in (_PARAGRAPH, _SENTENCE_END) for m in rx.finditer(text)})
    else:
        spans, at = [], 0
        for k, p in enumerate(passages(spec)):
            p = p.strip()
            where = text.find(p, at)
            if not p or where < 0:
                raise DataError(f"--sources: passage {k} ({p[:40]!r}) is not in the prompt"
                                + (" after the passage before it" if at else ""))
            spans.append((where, where + len(p)))
            at = where + len(p)
        return spans
    spans, at = [], 0
    for start, end in cuts + [(len(text), len(text))]:
        if start < at:  # overlapping cuts (a sentence end before a blank line)
            at = max(at, end)
            continue
        piece = text[at:start]
        lead = len(piece) - len(piece.lstrip())
        body = piece.strip()
        if body:
            spans.append((at + lead, at + lead + len(body)))
        at = end
    return spans


def token_spans(text: str, offsets: list[tuple[int, int]], spec: str) -> list[dict]:
    """The sources of a prompt as token spans: [{"start", "end", "text"}] in order, from the
    prompt's ``text`` and its tokens' character ``offsets`` (a fast tokenizer's offset
    mapping; (0, 0) for special tokens). A source with no token of its own is left out."""
    spans = char_spans(text, spec)
    owner = [-1] * len(offsets)
    k = 0
    for i, (a, b) in enumerate(offsets):
        if b <= a:  # a special token: no characters
            continue
        while k < len(spans) and a >= spans[k][1]:
            k += 1
        if k < len(spans) and spans[k][0] <= a < spans[k][1]:
            owner[i] = k
        elif k < len(spans) and a < spans[k][0] < b:  # a token that starts in the white space before it
            owner[i] = k
    out = []
    for s, (ca, cb) in enumerate(spans):
        pos = [i for i, o in enumerate(owner) if o == s]
        if pos:
            out.append({"start": pos[0], "end": pos[-1] + 1, "text": text[ca:cb]})
    return out


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
