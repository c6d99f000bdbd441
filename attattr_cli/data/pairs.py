"""Counterfactual prompt pairs: the data of a circuit task (docs/circuits.md).

A pair is a clean prompt, a counterfactual prompt of the same token length, the right
answer and the wrong one (the foil) of the clean prompt, each a continuation token or a
set of them. The metric of a pair is the logit difference answer - foil (set: the mean
logit of the set), taken on the clean and on the counterfactual run alike.

JSONL, one object per line::

    {"prompt": "When Mary and John went to the store, John gave a drink to",
     "counterfactual": "When Anna and Paul went to the store, Mark gave a drink to",
     "answer": " Mary", "foil": " John"}

``answer`` and ``foil`` are strings or lists of strings (each must be one token for the
model's tokenizer); other fields are kept as ``meta``.

Generators (``GENERATORS``, one registered entry each) write such pairs for any tokenizer:
``ioi`` (indirect-object identification), ``greater-than`` (years after a given one) and
``capitals`` (a fact: a country's capital); further tasks register with :func:`generator`.
Each checks, for the tokenizer it is given, that every answer and foil is one token and that
the clean and the counterfactual prompt have the same token length.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import DataError

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


def _length(tokenizer, text: str) -> int:
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


# ---------------------------------------------------------------- generators

Generator = Callable[..., list[Pair]]
GENERATORS: dict[str, Generator] = {}


def generator(name: str):
    def deco(fn: Generator) -> Generator:
        GENERATORS[name] = fn
        return fn
    return deco


def generate(task: str, tokenizer, count: int, seed: int = 0) -> list[Pair]:
    if task not in GENERATORS:
        raise DataError(f"no pair generator {task!r}; available: {', '.join(sorted(GENERATORS))}")
    if count < 1:
        raise DataError("count must be at least 1")
    return GENERATORS[task](tokenizer, count=count, seed=seed)


NAMES = ("Mary", "John", "Tom", "James", "Dan", "Sarah", "Michael", "David", "Paul", "Mark", "Anna",
         "Lisa", "Kate", "Amy", "Emma", "Sam", "Jack", "Ben", "Alex", "Peter", "George", "Laura",
         "Rachel", "Chris", "Mike", "Joe", "Steve", "Robert", "Kevin", "Jessica", "Andrew", "Eric")
PLACES = ("store", "park", "school", "garden", "hospital", "office", "station", "restaurant")
OBJECTS = ("drink", "book", "ring", "ball", "bag", "snack", "computer", "necklace")
# the templates of the IOI task (Wang et al. 2022, as MIB uses them): A and B introduced, S repeated, IO answered
IOI_TEMPLATES = (
    "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a long argument. Afterwards {S} said to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "The {PLACE} {A} and {B} went to had a {OBJECT}. {S} gave it to",
)


def usable_names(tokenizer, names: Sequence[str] = NAMES) -> list[str]:
    """Names that are one token with a leading space (as the answer) and inside a sentence."""
    return [n for n in names if one_token(tokenizer, " " + n) is not None]


def _draw(count: int, seed: int, make: Callable[[random.Random, int], "Pair | None"], what: str) -> list[Pair]:
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


@generator("ioi")
def ioi(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """Indirect-object identification: "When Mary and John went to the store, John gave a drink
    to" -> " Mary" against " John"; the counterfactual puts three other names in (the ABC
    distribution), so that it carries no information about which name is the answer."""
    names = usable_names(tokenizer)
    if len(names) < 5:
        raise DataError(f"only {len(names)} of the IOI names are one token for this tokenizer (5 needed)")
    def make(rng, i):
        template = IOI_TEMPLATES[i % len(IOI_TEMPLATES)]
        io, s, c1, c2, c3 = rng.sample(names, 5)
        place, obj = rng.choice(PLACES), rng.choice(OBJECTS)
        first, second = (io, s) if rng.random() < 0.5 else (s, io)
        fill = dict(PLACE=place, OBJECT=obj)
        clean = template.format(A=first, B=second, S=s, **fill)
        cf = template.format(A=c1, B=c2, S=c3, **fill)
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        return Pair(i, clean, cf, (" " + io,), (" " + s,), {"task": "ioi", "template": IOI_TEMPLATES.index(template)})

    return _draw(count, seed, make, "IOI pairs of equal token length")


# ---------------------------------------------------------------- greater-than

# the nouns and the template of the greater-than task (Hanna et al. 2023)
GT_NOUNS = ("war", "expedition", "project", "reign", "campaign", "journey", "contract", "drought", "famine",
            "dynasty", "pilgrimage", "siege", "voyage", "occupation", "empire", "festival", "strike", "revolt")
GT_TEMPLATE = "The {noun} lasted from the year {century}{year:02d} to the year {century}"
GT_CENTURIES = tuple(range(11, 18))


def year_tokens(tokenizer) -> tuple[str, dict[str, int]]:
    """How a tokenizer writes the two last digits of a year after its century: ``("two", ids)``
    where every two-digit string 00..99 is one token (GPT-2's), else ``("one", ids)`` where
    the digits are tokens one by one (SmolLM2's, Llama's): the next token is the tens digit.
    ``ids`` maps each string to its token id."""
    two = {f"{y:02d}": one_token(tokenizer, f"{y:02d}") for y in range(100)}
    if all(v is not None for v in two.values()):
        return "two", two
    one = {str(d): one_token(tokenizer, str(d)) for d in range(10)}
    if all(v is not None for v in one.values()):
        return "one", one
    raise DataError("this tokenizer writes neither every two-digit number nor every digit as one token;"
                    " the greater-than task needs one of them")


def greater_than_sets(year: int, mode: str) -> tuple[list[str], list[str]]:
    """The answer and foil continuations of "... to the year {century}" after the year ``year``
    (0..99): with two-digit tokens the years above it against those at or below it; with one
    digit per token the tens digits above ``year``'s against those below (its own tens digit
    holds years on both sides and is neither)."""
    if mode == "two":
        return [f"{y:02d}" for y in range(year + 1, 100)], [f"{y:02d}" for y in range(0, year + 1)]
    tens = year // 10
    return [str(d) for d in range(tens + 1, 10)], [str(d) for d in range(0, tens)]


@generator("greater-than")
def greater_than(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """Greater-than: "The war lasted from the year 1732 to the year 17" -> the years above 32
    against those at or below it (answer and foil are sets of tokens; the metric is the mean
    logit of the answer set minus that of the foil set). The counterfactual names the year 01
    ("... from the year 1701 ..."), as the task's literature does. A tokenizer with a token
    for every two-digit number is asked for the two digits; one that splits digits one by one
    for the tens digit (:func:`greater_than_sets`)."""
    mode, ids = year_tokens(tokenizer)
    years = list(range(2, 99)) if mode == "two" else list(range(10, 90))  # both sets non-empty
    plain = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731

    def make(rng, i):
        noun, century, year = rng.choice(GT_NOUNS), rng.choice(GT_CENTURIES), rng.choice(years)
        clean = GT_TEMPLATE.format(noun=noun, century=century, year=year)
        cf = GT_TEMPLATE.format(noun=noun, century=century, year=1)
        answer, foil = greater_than_sets(year, mode)
        # the next token after the prompt must be the one asked for: "17" + "33" -> ... "33"
        base = plain(clean)
        if _length(tokenizer, cf) != _length(tokenizer, clean) or any(
                plain(clean + t) != base + [ids[t]] for t in (answer[0], answer[-1], foil[0], foil[-1])):
            return None
        return Pair(i, clean, cf, tuple(answer), tuple(foil), {"task": "greater-than", "year": year, "digits": mode})

    return _draw(count, seed, make, "greater-than pairs of equal token length whose last token is the century")


# ---------------------------------------------------------------- capitals

COUNTRIES = (
    ("France", "Paris"), ("Germany", "Berlin"), ("Italy", "Rome"), ("Spain", "Madrid"), ("Japan", "Tokyo"),
    ("Russia", "Moscow"), ("England", "London"), ("China", "Beijing"), ("Egypt", "Cairo"), ("Greece", "Athens"),
    ("Austria", "Vienna"), ("Portugal", "Lisbon"), ("Ireland", "Dublin"), ("Norway", "Oslo"),
    ("Sweden", "Stockholm"), ("Finland", "Helsinki"), ("Denmark", "Copenhagen"), ("Poland", "Warsaw"),
    ("Hungary", "Budapest"), ("Belgium", "Brussels"), ("Netherlands", "Amsterdam"), ("Canada", "Ottawa"),
    ("Australia", "Canberra"), ("India", "Delhi"), ("Kenya", "Nairobi"), ("Peru", "Lima"), ("Chile", "Santiago"),
    ("Cuba", "Havana"), ("Thailand", "Bangkok"), ("Turkey", "Ankara"), ("Iran", "Tehran"),
    ("Iraq", "Baghdad"), ("Syria", "Damascus"), ("Lebanon", "Beirut"), ("Ukraine", "Kyiv"), ("Romania", "Bucharest"),
    ("Colombia", "Bogota"), ("Vietnam", "Hanoi"), ("Indonesia", "Jakarta"),
    ("Nigeria", "Abuja"), ("Morocco", "Rabat"), ("Switzerland", "Bern"), ("Scotland", "Edinburgh"),
)
CAPITAL_TEMPLATES = (
    "The capital of {country} is",
    "The capital city of {country} is",
    "{country}'s capital is the city of",
    "The government of {country} sits in the city of",
)


@generator("capitals")
def capitals(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """A fact: "The capital of France is" -> " Paris" against the capital of the counterfactual's
    country ("The capital of Germany is" -> " Berlin"), a country of the same token length
    whose capital is another city. Only countries whose capital (with a leading space) is one
    token for the tokenizer take part (``COUNTRIES``, about 40)."""
    usable = [(c, cap) for c, cap in COUNTRIES if one_token(tokenizer, " " + cap) is not None]
    if len(usable) < 2:
        raise DataError(f"only {len(usable)} of the capitals are one token for this tokenizer (2 needed)")
    def make(rng, i):
        template = CAPITAL_TEMPLATES[i % len(CAPITAL_TEMPLATES)]
        (country, capital), (other, other_capital) = rng.sample(usable, 2)
        if one_token(tokenizer, " " + capital) == one_token(tokenizer, " " + other_capital):
            return None
        clean, cf = template.format(country=country), template.format(country=other)
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        return Pair(i, clean, cf, (" " + capital,), (" " + other_capital,),
                    {"task": "capitals", "template": CAPITAL_TEMPLATES.index(template)})

    return _draw(count, seed, make, "capital pairs of equal token length")


# ---------------------------------------------------------------- tasks of other kinds
# (made to check that a head ranking holds on behaviours it was not built on: docs/circuits.md)

SURNAMES = ("Smith", "Brown", "Jones", "Miller", "Davis", "Wilson", "Taylor", "Clark", "Moore", "White", "Hall",
            "Young", "King", "Wright", "Green", "Baker", "Adams", "Hill", "Scott", "Lee", "Walker", "Allen", "Hughes",
            "Evans", "Turner", "Parker", "Cook", "Morgan", "Bell", "Ward", "Cooper", "Reed")
COPY_TEMPLATES = (
    "I sat next to {F} {L} at the dinner. After the dinner, {F}",
    "The letter was signed by {F} {L}. Everyone knew that {F}",
    "Our new neighbour is called {F} {L}. This morning {F}",
    "The prize went to {F} {L} last year. This year {F}",
)


@generator("copying")
def copying(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """Copying a name seen earlier (an induction task): "I sat next to Anna Smith at the dinner.
    After the dinner, Anna" -> " Smith" against " Brown"; the counterfactual names Anna Brown
    instead, so that the copy points at the foil."""
    first = usable_names(tokenizer)
    last = usable_names(tokenizer, SURNAMES)
    if len(first) < 1 or len(last) < 2:
        raise DataError("too few one-token names and surnames for this tokenizer for the copying task")

    def make(rng, i):
        template = COPY_TEMPLATES[i % len(COPY_TEMPLATES)]
        f = rng.choice(first)
        l1, l2 = rng.sample(last, 2)
        clean, cf = template.format(F=f, L=l1), template.format(F=f, L=l2)
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        return Pair(i, clean, cf, (" " + l1,), (" " + l2,), {"task": "copying", "template": COPY_TEMPLATES.index(template)})

    return _draw(count, seed, make, "copying pairs of equal token length")


MALE = ("John", "James", "Michael", "David", "Paul", "Mark", "Tom", "Dan", "Jack", "Ben", "Peter", "George", "Steve",
        "Robert", "Kevin", "Eric", "Andrew", "Joe", "Mike", "Sam")
FEMALE = ("Mary", "Sarah", "Anna", "Lisa", "Kate", "Amy", "Emma", "Laura", "Rachel", "Jessica", "Susan", "Linda",
          "Helen", "Karen", "Julia", "Alice", "Claire", "Sophie", "Lucy", "Grace")
PRONOUN_TEMPLATES = (
    "{N} was tired after the long trip, so",
    "When {N} opened the door,",
    "{N} missed the bus this morning because",
    "After {N} finished the exam,",
)


@generator("pronoun")
def pronoun(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """A gendered pronoun: "Mary was tired after the long trip, so" -> " she" against " he"; the
    counterfactual names someone of the other gender (the continuation's pronoun flips)."""
    male, female = usable_names(tokenizer, MALE), usable_names(tokenizer, FEMALE)
    if not male or not female or one_token(tokenizer, " he") is None or one_token(tokenizer, " she") is None:
        raise DataError("this tokenizer lacks one-token names of both genders or the pronouns he / she")

    def make(rng, i):
        template = PRONOUN_TEMPLATES[i % len(PRONOUN_TEMPLATES)]
        woman = rng.random() < 0.5
        n, other = (rng.choice(female), rng.choice(male)) if woman else (rng.choice(male), rng.choice(female))
        clean, cf = template.format(N=n), template.format(N=other)
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        answer, foil = (" she", " he") if woman else (" he", " she")
        return Pair(i, clean, cf, (answer,), (foil,), {"task": "pronoun", "template": PRONOUN_TEMPLATES.index(template)})

    return _draw(count, seed, make, "pronoun pairs of equal token length")


AGREEMENT_NOUNS = (("key", "keys"), ("dog", "dogs"), ("author", "authors"), ("teacher", "teachers"),
                   ("house", "houses"), ("car", "cars"), ("student", "students"), ("picture", "pictures"),
                   ("farmer", "farmers"), ("book", "books"), ("doctor", "doctors"), ("bird", "birds"))
AGREEMENT_ATTRACTORS = ("near the cabinet", "next to the windows", "behind the trees", "of the old man",
                        "by the river", "beside the chairs", "in the garden", "with the boxes")


@generator("agreement")
def agreement(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """Subject-verb agreement across an attractor: "The key near the cabinets" -> " is" against
    " are"; the counterfactual makes the subject plural ("The keys ...": the verb flips)."""
    if one_token(tokenizer, " is") is None or one_token(tokenizer, " are") is None:
        raise DataError("this tokenizer does not write ' is' and ' are' as one token each")

    def make(rng, i):
        (sing, plural), attractor = rng.choice(AGREEMENT_NOUNS), rng.choice(AGREEMENT_ATTRACTORS)
        plural_first = rng.random() < 0.5
        a, b = (plural, sing) if plural_first else (sing, plural)
        clean, cf = f"The {a} {attractor}", f"The {b} {attractor}"
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        answer, foil = (" are", " is") if plural_first else (" is", " are")
        return Pair(i, clean, cf, (answer,), (foil,), {"task": "agreement", "noun": sing})

    return _draw(count, seed, make, "agreement pairs of equal token length")


MCQ_CATEGORIES = {
    "fruit": ("apple", "banana", "orange", "pear", "grape", "lemon", "cherry", "peach"),
    "animal": ("dog", "cat", "horse", "cow", "sheep", "rabbit", "mouse", "lion"),
    "colour": ("red", "blue", "green", "yellow", "purple", "brown", "pink", "white"),
    "tool": ("hammer", "saw", "drill", "wrench", "shovel", "knife", "axe", "rake"),
}
MCQ_TEMPLATE = "Question: Which of these is a {category}? A. {a} B. {b} C. {c} Answer:"


@generator("mcq")
def mcq(tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """A multiple-choice question in MIB's style: "Question: Which of these is a fruit? A. chair
    B. apple C. stone Answer:" -> " B" against the letter the right option holds in the
    counterfactual, which puts the same three options in another order (the same tokens, so the
    same length: only where the answer stands changes)."""
    letters = [" A", " B", " C"]
    if any(one_token(tokenizer, x) is None for x in letters):
        raise DataError("this tokenizer does not write ' A', ' B' and ' C' as one token each")

    def make(rng, i):
        category = rng.choice(sorted(MCQ_CATEGORIES))
        right = rng.choice(MCQ_CATEGORIES[category])
        others = [c for c in sorted(MCQ_CATEGORIES) if c != category]
        wrong = [rng.choice(MCQ_CATEGORIES[c]) for c in rng.sample(others, 2)]
        options = [right] + wrong
        rng.shuffle(options)
        moved = options[:]
        while moved.index(right) == options.index(right):
            rng.shuffle(moved)
        clean = MCQ_TEMPLATE.format(category=category, a=options[0], b=options[1], c=options[2])
        cf = MCQ_TEMPLATE.format(category=category, a=moved[0], b=moved[1], c=moved[2])
        if _length(tokenizer, clean) != _length(tokenizer, cf):
            return None
        return Pair(i, clean, cf, (letters[options.index(right)],), (letters[moved.index(right)],),
                    {"task": "mcq", "category": category})

    return _draw(count, seed, make, "multiple-choice pairs of equal token length")
