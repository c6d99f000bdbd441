"""Sources: which tokens of a long prompt are its passages (docs/long-context.md, "Sources").

A source is a span of consecutive token positions (start, end), end exclusive, as the spans of
analysis/aggregate.py: a passage only, found in the prompt's text (``paragraphs``, ``sentences``, or
the passages of a JSONL ``FILE[:FIELD]``) and mapped to tokens by the tokenizer's character offsets.
The chat template around the user's message and the question (the last paragraph) are never
sources. A token belongs to the source its first character lies in; tokens in no source are not
listed. Torch-free: the scorer and the source-removal check ask :func:`prompt_spans`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..errors import DataError, OptionError

KINDS = ("sentences", "paragraphs")
_PARAGRAPH = re.compile(r"\n[ \t\r\f\v]*\n\s*")
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"'”’)\]]*\s+")
_ROLE_LINE = re.compile(r"[ \t]*[A-Za-z_][\w-]*[ \t]*\n")  # "user\n" right after <|im_start|>
_MARKER = "\u2063attattr-content\u2063"


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


# -- the template --------------------------------------------------------------------------------
def template_around(tokenizer) -> tuple[str, str] | None:
    """(head, tail): the text the tokenizer's chat template puts before and after one user
    message, with the generation prompt; None without a chat template."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": _MARKER}], tokenize=False,
                                                 add_generation_prompt=True)
    except Exception:  # a template that refuses one user message (or needs other roles): none known
        return None
    if not isinstance(rendered, str) or rendered.count(_MARKER) != 1:
        return None
    head, tail = rendered.split(_MARKER)
    return head, tail


def special_strings(tokenizer) -> list[str]:
    """The text of the tokenizer's special tokens (``<|im_start|>`` ...), longest first."""
    found = set(getattr(tokenizer, "all_special_tokens", None) or [])
    for tok in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(tok, "special", False):
            found.add(str(tok.content))
    return sorted((s for s in found if s and s.strip()), key=len, reverse=True)


def content_bounds(text: str, template: tuple[str, str] | None = None, specials=()) -> tuple[int, int]:
    """The characters (start, end) of ``text`` that hold the user's content (module docstring):
    inside the chat ``template``'s (head, tail) where the text begins with its head; else the
    longest stretch between ``specials`` (less a role line right after one); else all of it."""
    if template is not None:
        head, tail = template
        if head.strip() and text.startswith(head):
            start = len(head)
            end = text.find(tail, start) if tail.strip() else -1
            if end < 0:  # rendered without the generation prompt: up to the next special token
                later = [text.find(s, start) for s in specials]
                end = min([i for i in later if i >= 0], default=len(text))
            return start, end
    marks = []
    for s in specials:
        i = text.find(s)
        while i >= 0:
            marks.append((i, i + len(s)))
            i = text.find(s, i + len(s))
    if not marks:
        return 0, len(text)
    marks.sort()
    stretches, at, after_mark = [], 0, False
    for a, b in marks + [(len(text), len(text))]:
        if a >= at:
            start = at
            role = _ROLE_LINE.match(text, start) if after_mark else None
            if role is not None:
                start = role.end()
            stretches.append((start, a))
        at, after_mark = max(at, b), True
    return max(stretches, key=lambda s: (len(text[s[0]:s[1]].strip()), -s[0]))


# -- passages as characters, then as tokens ------------------------------------------------------
def _pieces(text: str, lo: int, hi: int, cuts) -> list[tuple[int, int]]:
    """The stretches of text[lo:hi] between the regex matches ``cuts``, white space trimmed."""
    spans, at = [], lo
    for start, end in cuts + [(hi, hi)]:
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


def _cuts(rx, text: str, lo: int, hi: int) -> list[tuple[int, int]]:
    return [(m.start(), m.end()) for m in rx.finditer(text, lo, hi)]


def char_spans(text: str, spec: str, bounds: tuple[int, int] | None = None) -> list[tuple[int, int]]:
    """The passages of ``text`` as character spans (start, end), white space trimmed: the
    content (``bounds``, default the whole text) less its question (module docstring), or a
    JSONL file's passages found in the text."""
    lo, hi = bounds if bounds is not None else (0, len(text))
    if spec not in KINDS:
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
    paragraphs = _pieces(text, lo, hi, _cuts(_PARAGRAPH, text, lo, hi))
    if spec == "paragraphs":
        return paragraphs[:-1]
    if len(paragraphs) > 1:  # the sentences of every paragraph but the question's
        a, b = paragraphs[0][0], paragraphs[-2][1]
        return _pieces(text, a, b, sorted({*_cuts(_PARAGRAPH, text, a, b), *_cuts(_SENTENCE_END, text, a, b)}))
    return _pieces(text, lo, hi, _cuts(_SENTENCE_END, text, lo, hi))[:-1]


def token_spans(text: str, offsets: list[tuple[int, int]], spec: str,
                bounds: tuple[int, int] | None = None) -> list[dict]:
    """The passages of a prompt as token spans: [{"start", "end", "text"}] in order, from the
    prompt's ``text``, its tokens' character ``offsets`` (a fast tokenizer's offset mapping;
    (0, 0) for special tokens) and the content's ``bounds``. A passage with no token of its own
    is left out."""
    spans = char_spans(text, spec, bounds)
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


def prompt_spans(tokenizer, text: str, spec: str, index: int = 0) -> list[dict]:
    """The passages of the prompt ``text`` (example ``index``) as the tokenizer's token spans:
    its template and its question left out (module docstring). OptionError without a fast
    tokenizer, DataError where no passage is found."""
    try:
        enc = tokenizer(text, add_special_tokens=True, return_offsets_mapping=True)
    except (NotImplementedError, ValueError, TypeError):
        raise OptionError("--sources needs a fast tokenizer (one that gives character offsets)") from None
    bounds = content_bounds(text, template_around(tokenizer), special_strings(tokenizer))
    spans = token_spans(text, [tuple(o) for o in enc["offset_mapping"]], spec, bounds)
    if not spans:
        what = "passages" if spec not in KINDS else spec
        hint = (": the passages are the paragraphs before the question (the text after the last blank line);"
                " separate them with blank lines") if spec in KINDS else ""
        raise DataError(f"example {index}: no {what} found in the prompt{hint}")
    return spans
