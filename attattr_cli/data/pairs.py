"""Counterfactual prompt pairs: the data of a circuit task (docs/circuits.md, "The data").

A pair is a clean prompt, a counterfactual prompt of the same token length, and the right answer
and the wrong one (the foil) of the clean prompt, each one continuation token or a set of them; its
metric is the logit difference answer - foil (a set's logit: the mean over the set) on either
prompt. A JSONL file holds one object per line with ``prompt``, ``counterfactual``, ``answer`` and
``foil`` (a string or a list of strings); other fields are kept as ``meta``. ``PAIR_TASKS`` holds the
registered :class:`PairTask` generators, one per module of data/pair_tasks/, each checking its pairs
against the tokenizer it is given.
"""

from __future__ import annotations

import functools
import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import DataError
from ..registry import Registry

FIELDS = ("prompt", "counterfactual", "answer", "foil")
# what a pairs file may hold: its size and one line's (a device such as /dev/zero, or a file
# that is not pairs, is refused in one line instead of read without end)
MAX_BYTES = 256 * 2**20
MAX_LINE_BYTES = 2**20


@dataclass
class Pair:
    """One clean / counterfactual pair. ``answer`` and ``foil`` are tuples of strings."""

    index: int
    prompt: str
    counterfactual: str
    answer: tuple[str, ...]
    foil: tuple[str, ...]
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict:
        one = lambda t: t[0] if len(t) == 1 else list(t)  # noqa: E731
        return {"prompt": self.prompt, "counterfactual": self.counterfactual,
                "answer": one(self.answer), "foil": one(self.foil), **self.meta}


def _tokens(value: Any, name: str, where: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) and v for v in value):
        raise DataError(f"{where}: {name!r} must be a non-empty string or a list of them")
    return tuple(value)


def pair_from_dict(obj: Any, index: int, where: str, distinct: bool = False) -> Pair:
    """A pair from its JSON object (DataError naming ``where`` when it is not one); with
    ``distinct`` a counterfactual that is the prompt itself is refused (a circuit's pair: it
    would change nothing)."""
    if not isinstance(obj, dict):
        raise DataError(f"{where}: a pair is a JSON object with fields {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if f not in obj]
    if missing:
        raise DataError(f"{where}: missing field {missing[0]!r} (a pair needs {', '.join(FIELDS)})")
    for f in ("prompt", "counterfactual"):
        if not isinstance(obj[f], str) or not obj[f].strip():
            raise DataError(f"{where}: {f!r} must be a non-empty string")
    answer = _tokens(obj["answer"], "answer", where)
    foil = _tokens(obj["foil"], "foil", where)
    if set(answer) & set(foil):
        raise DataError(f"{where}: the answer and the foil share {sorted(set(answer) & set(foil))[0]!r};"
                        " the metric answer - foil would be zero")
    if distinct and obj["counterfactual"] == obj["prompt"]:
        raise DataError(f"{where}: the counterfactual is the prompt itself; it changes nothing, so the heads'"
                        " effects and the faithfulness ratio are undefined (give a counterfactual that differs)")
    meta = {k: v for k, v in obj.items() if k not in FIELDS}
    return Pair(index, obj["prompt"], obj["counterfactual"], answer, foil, meta)


def _mb(n: int) -> str:
    return f"{n / 2**20:.0f} MB" if n >= 2**20 else f"{n} bytes"


def read_bounded(path: str | os.PathLike) -> str:
    """The text of a pairs file, read with bounds: a regular file (a device, a FIFO or a folder
    is refused), at most MAX_BYTES, no line over MAX_LINE_BYTES; each refusal one DataError."""
    import stat

    name = os.fspath(path)
    try:
        mode = os.stat(name).st_mode  # before opening: opening a FIFO waits for a writer
        if not stat.S_ISREG(mode):
            what = "a folder" if stat.S_ISDIR(mode) else "a device, a FIFO or a socket"
            raise DataError(f"{name} is not a regular file ({what}); give a JSONL file of pairs")
        with open(name, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except (OSError, ValueError) as exc:
        raise DataError(f"{name}: cannot read ({exc})") from None
    if len(raw) > MAX_BYTES:
        raise DataError(f"{name} is larger than {_mb(MAX_BYTES)}, more than a pairs file may hold; split it")
    start = 0
    for line_no, end in enumerate(_line_ends(raw), 1):
        if end - start > MAX_LINE_BYTES:
            raise DataError(f"{name} line {line_no} is longer than {_mb(MAX_LINE_BYTES)}, more than a pair's"
                            " line may hold (is it a JSONL file of pairs, one per line?)")
        start = end + 1
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{name}: cannot read ({exc})") from None


def _line_ends(raw: bytes):
    """The offsets of the newlines of ``raw``, and its end."""
    at = raw.find(b"\n")
    while at != -1:
        yield at
        at = raw.find(b"\n", at + 1)
    yield len(raw)


def read_pairs(path: str | os.PathLike, distinct: bool = False) -> list[Pair]:
    """Pairs from a JSONL file (one object per line; blank lines skipped), read with bounds
    (:func:`read_bounded`); ``distinct``: a counterfactual that is its prompt is refused."""
    name = os.fspath(path)
    lines = read_bounded(name).splitlines()
    pairs: list[Pair] = []
    for line_no, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name} line {line_no}"
        try:
            obj = json.loads(line)
        except (ValueError, RecursionError) as exc:
            from .readers import json_problem

            raise DataError(f"{where}: not valid JSON ({json_problem(exc)})") from None
        pairs.append(pair_from_dict(obj, len(pairs), where, distinct))
    if not pairs:
        raise DataError(f"{name}: no pairs (a JSONL file of objects with {', '.join(FIELDS)})")
    return pairs


def is_pairs_file(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a JSONL file of pairs: its first object has every field of a pair
    (``prompt``, ``counterfactual``, ``answer``, ``foil``). Reads only its first line."""
    name = os.fspath(path)
    if not name.lower().endswith((".jsonl", ".json")):
        return False
    try:
        if not os.path.isfile(name):  # a device (/dev/zero) is read by no one here: the reader refuses it
            return False
        with open(name, encoding="utf-8") as fh:
            while True:
                line = fh.readline(MAX_LINE_BYTES + 1)
                if not line or len(line) > MAX_LINE_BYTES:
                    return False
                if line.strip():
                    obj = json.loads(line)
                    return isinstance(obj, dict) and all(f in obj for f in FIELDS)
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):  # not pairs: the table reader says why
        return False


def as_examples(pairs: Sequence[Pair]):
    """Pairs as the examples a scoring run reads (data/types.py ``Example``): the clean prompt
    as the text, the counterfactual, answer and foil under ``meta["pair"]`` (kept with each
    example in a store), the pair's other fields in ``meta``."""
    from .types import Example

    return [Example(p.index, p.prompt, meta={**p.meta, "pair": {
        "counterfactual": p.counterfactual, "answer": list(p.answer), "foil": list(p.foil)}}) for p in pairs]


def pair_of_example(example) -> Pair:
    """The pair an example made by :func:`as_examples` holds (DataError when it holds none)."""
    pair = (example.meta or {}).get("pair") if isinstance(example.meta, dict) else None
    if not isinstance(pair, dict):
        raise DataError(f"example {example.index} is not a pair: --metric scores a JSONL of pairs"
                        f" ({', '.join(FIELDS)})")
    where = f"pair {example.index}"
    obj = {"prompt": example.text_a, **pair}
    return pair_from_dict(obj, example.index, where)


def write_pairs(path: str | os.PathLike, pairs: Sequence[Pair]) -> None:
    from ..fileio import dumps

    with open(os.fspath(path), "w", encoding="utf-8") as fh:
        for p in pairs:
            fh.write(dumps(p.to_json()) + "\n")


def one_token(tokenizer, text: str) -> int | None:
    """The id of ``text`` as one continuation token, or None when it is several (or the
    tokenizer's unknown token, which stands for any word it does not know)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1 or (getattr(tokenizer, "unk_token_id", None) is not None and ids[0] == tokenizer.unk_token_id):
        return None
    return ids[0]


def token_length(tokenizer, text: str) -> int:
    return len(tokenizer(text)["input_ids"])


@dataclass
class Encoded:
    """A pair as token ids: clean and counterfactual ids of equal length, answer and foil ids."""

    clean: list[int]
    counterfactual: list[int]
    answer: list[int]
    foil: list[int]


def encode_pair(tokenizer, pair: Pair, limit: int | None = None) -> Encoded:
    """Token ids of a pair, checked: equal lengths, one-token answers and foils."""
    enc = lambda s: list(tokenizer(s, add_special_tokens=True)["input_ids"])  # noqa: E731
    clean, cf = enc(pair.prompt), enc(pair.counterfactual)
    where = f"pair {pair.index}"
    if len(clean) != len(cf):
        raise DataError(f"{where}: the prompt has {len(clean)} tokens and the counterfactual {len(cf)};"
                        " a pair must have equal token lengths")
    if limit is not None and len(clean) > limit:
        raise DataError(f"{where}: {len(clean)} tokens, more than the model's {limit}")
    ids = {}
    for name in ("answer", "foil"):
        out = []
        for t in getattr(pair, name):
            i = one_token(tokenizer, t)
            if i is None:
                raise DataError(f"{where}: the {name} {t!r} is not one token for this tokenizer")
            out.append(i)
        ids[name] = out
    if set(ids["answer"]) & set(ids["foil"]):
        raise DataError(f"{where}: the answer and the foil are the same token; the metric would be zero")
    return Encoded(clean, cf, ids["answer"], ids["foil"])


# ---------------------------------------------------------------- tasks


@dataclass(frozen=True)
class PairTask:
    """A generator of clean / counterfactual pairs for any tokenizer (data/pair_tasks/, one
    module each): ``generate(tokenizer, count, seed)`` returns ``count`` pairs whose answers and
    foils are one token and whose prompts have equal token lengths, or raises DataError."""

    name: str
    description: str
    generate: Callable[..., list[Pair]]
    reference: str = ""
    kind: str = "pairs"
    cost: str = "the tokenizer only"


PAIR_TASKS = Registry("pair task", units="pairs", command="demo data")


NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sarah", "Michael", "David", "Paul", "Mark", "Anna",
         "Lisa", "Kate", "Amy", "Emma", "Sam", "Jack", "Ben", "Alex", "Peter", "George", "Laura",
         "Rachel", "Chris", "Mike", "Joe", "Steve", "Robert", "Kevin", "Jessica", "Andrew", "Eric")


def usable_names(tokenizer, names: Sequence[str] = NAMES) -> list[str]:
    """Names that are one token with a leading space (as the answer) and inside a sentence."""
    return [n for n in names if one_token(tokenizer, " " + n) is not None]


def pair_task(name: str, description: str, what: str, templates: Sequence[str] = (), reference: str = ""):
    """Register the decorated ``setup(tokenizer)`` as the pair task ``name`` and return its
    ``generate(tokenizer, count, seed=0)`` (with setup's name, module and docstring). ``setup``
    checks the tokenizer (DataError when it cannot serve the task) and returns how one pair is
    drawn: with ``templates``, ``fill(rng)`` giving (the clean prompt's fields, the
    counterfactual's, answer, foil) or None for a draw to discard, the templates taken in turn
    and a pair kept when both prompts have the same token length (meta: the task and the
    template's index); without, ``make(rng, index)`` as :func:`draw_pairs` takes it. ``what``
    names the pairs in the error when too few fit."""
    def register(setup):
        @functools.wraps(setup)
        def generate(tokenizer, count: int, seed: int = 0) -> list[Pair]:
            draw = setup(tokenizer)
            if not templates:
                return draw_pairs(count, seed, draw, what)

            def make(rng, i):
                t = i % len(templates)
                got = draw(rng)
                if got is None:
                    return None
                clean, cf = templates[t].format(**got[0]), templates[t].format(**got[1])
                if token_length(tokenizer, clean) != token_length(tokenizer, cf):
                    return None
                return Pair(i, clean, cf, (got[2],), (got[3],), {"task": name, "template": t})

            return draw_pairs(count, seed, make, what)

        PAIR_TASKS.register(PairTask(name, description, generate, reference))
        return generate
    return register


def draw_pairs(count: int, seed: int, make: Callable[[random.Random, int], "Pair | None"], what: str) -> list[Pair]:
    """``count`` pairs from ``make(rng, index)``, which returns a pair or None for a draw that
    does not fit the tokenizer (drawn again; a DataError after 100 draws per pair)."""
    rng = random.Random(seed)
    pairs: list[Pair] = []
    attempts = 0
    while len(pairs) < count:
        attempts += 1
        if attempts > 100 * count:
            raise DataError(f"could not make {what} for this tokenizer")
        pair = make(rng, len(pairs))
        if pair is not None:
            pairs.append(pair)
    return pairs


