"""The built-in synthetic pair-classification task (MNLI-like; docs/cli.md, "attattr demo data").

Each example is a premise / hypothesis pair of pseudo-word distractors with one planted key word in
each segment, premise word ``P[i]`` and hypothesis word ``Q[k]``; the pair alone decides the label:
``entailment`` when ``k == i``, ``contradiction`` when ``k == SIGMA[i]`` (SIGMA has no fixed points),
``neutral`` otherwise. ``Example.meta`` holds the ground truth an attribution method should recover,
``{"pair": [premise_word, hypothesis_word], "pair_word_index": [i_in_premise, j_in_hypothesis]}``
(word indices within each whitespace-split segment). Deterministic given the seed: :func:`heldout`
(the default data) and :func:`train_set`.
"""

from __future__ import annotations

import csv
import random
from pathlib import Path

from attattr_cli.data.types import Example
from attattr_cli.errors import DataError, OptionError
from attattr_cli.fileio import replaced
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity

LABELS: tuple[str, ...] = ("entailment", "neutral", "contradiction")
ENTAILMENT, NEUTRAL, CONTRADICTION = 0, 1, 2

#: Key words of the premise (P) and of the hypothesis (Q).
PREMISE_WORDS: tuple[str, ...] = ("blick", "daxo", "wugga", "tomver", "fepple", "zorbin")
HYPOTHESIS_WORDS: tuple[str, ...] = ("kiki", "bouba", "mibbet", "glorp", "snerdy", "vashu")

#: The contradiction partner: premise word i contradicts hypothesis word SIGMA[i].
#: A fixed permutation without fixed points.
SIGMA: tuple[int, ...] = (2, 4, 5, 0, 1, 3)

#: Distractor pseudo-words, shared by both segments.
DISTRACTORS: tuple[str, ...] = (
    "lomi", "paru", "seka", "tivo", "nabe", "rulo", "mepa", "kosu", "dite", "fano",
    "gabu", "hime", "jora", "kelu", "lapi", "mosa", "nuti", "pobe", "rika", "sulo",
    "tane", "vemi", "wabo", "yuke", "zila", "bero", "caso", "duna", "feli", "gomu",
    "hapa", "jine", "koro", "lume", "mivo", "nesa", "pilu", "rono", "sibe", "tuka",
    "vola", "wesi", "yamo", "zupe", "bami", "cule", "dora", "fipo", "gesu", "hoka",
    "juni", "kaze", "lero", "mabu", "nifa", "pesa", "riwo", "soma", "tegi", "vuro",
)

PREMISE_DISTRACTORS = (5, 12)  # inclusive range of distractor words in a premise
HYPOTHESIS_DISTRACTORS = (3, 8)  # inclusive range of distractor words in a hypothesis
#: The training set also holds shorter segments, down to the bare key words (docs/cli.md says why).
TRAIN_PREMISE_DISTRACTORS = (0, 12)
TRAIN_HYPOTHESIS_DISTRACTORS = (0, 8)

TRAIN_SEED = 20210202
HELDOUT_SEED = 7070707
HELDOUT_SIZE = 200

TSV_COLUMNS = ("premise", "hypothesis", "label", "pair", "pair_word_index")


def _check_words() -> None:
    words = vocabulary()
    assert len(set(words)) == len(words), "synthetic vocabulary has duplicates"
    assert all(w.isalpha() and w.islower() for w in words)
    assert sorted(SIGMA) == list(range(len(PREMISE_WORDS)))
    assert all(SIGMA[i] != i for i in range(len(SIGMA)))


def vocabulary() -> list[str]:
    """Every word the task uses: premise keys, hypothesis keys, then distractors."""
    return [*PREMISE_WORDS, *HYPOTHESIS_WORDS, *DISTRACTORS]


def label_of(premise_key: int, hypothesis_key: int) -> int:
    """The label index decided by the pair (indices into PREMISE_WORDS / HYPOTHESIS_WORDS)."""
    if hypothesis_key == premise_key:
        return ENTAILMENT
    if hypothesis_key == SIGMA[premise_key]:
        return CONTRADICTION
    return NEUTRAL


def _segment(rng: random.Random, key: str, n_range: tuple[int, int]) -> tuple[list[str], int]:
    n = rng.randint(*n_range)
    words = rng.sample(DISTRACTORS, n)
    pos = rng.randint(0, n)
    words.insert(pos, key)
    return words, pos


def generate(
    count: int,
    seed: int,
    start_index: int = 0,
    *,
    premise_distractors: tuple[int, int] = PREMISE_DISTRACTORS,
    hypothesis_distractors: tuple[int, int] = HYPOTHESIS_DISTRACTORS,
) -> list[Example]:
    """``count`` examples, deterministic given ``seed``; labels balanced (counts differ by <= 1).

    Prefix-stable: ``generate(k, seed)`` is the first ``k`` of ``generate(m, seed)``.

    ``index`` runs from ``start_index``.  The two ranges (inclusive) bound the
    number of distractor words around the key word of each segment.
    """
    if count < 0:
        raise ValueError("count must be >= 0")
    for lo, hi in (premise_distractors, hypothesis_distractors):
        if not 0 <= lo <= hi <= len(DISTRACTORS):
            raise ValueError(f"bad distractor range ({lo}, {hi})")
    rng = random.Random(seed)
    n_keys = len(PREMISE_WORDS)
    n_labels = len(LABELS)
    examples = []
    block: list[int] = []
    for n in range(count):
        # labels come in shuffled blocks of all three: any prefix is balanced, and
        # generate(k, seed) is a prefix of generate(m, seed) for k <= m
        if n % n_labels == 0:
            block = rng.sample(range(n_labels), n_labels)
        label = block[n % n_labels]
        i = rng.randrange(n_keys)
        if label == ENTAILMENT:
            k = i
        elif label == CONTRADICTION:
            k = SIGMA[i]
        else:
            k = rng.choice([x for x in range(n_keys) if x != i and x != SIGMA[i]])
        assert label_of(i, k) == label
        premise, pi = _segment(rng, PREMISE_WORDS[i], premise_distractors)
        hypothesis, hj = _segment(rng, HYPOTHESIS_WORDS[k], hypothesis_distractors)
        examples.append(Example(start_index + n, " ".join(premise), " ".join(hypothesis), label,
                                {"pair": [PREMISE_WORDS[i], HYPOTHESIS_WORDS[k]], "pair_word_index": [pi, hj]}))
    return examples


def heldout(count: int = HELDOUT_SIZE) -> list[Example]:
    """The fixed held-out set (seed :data:`HELDOUT_SEED`): the tool's default data."""
    return generate(count, HELDOUT_SEED)


def train_set(count: int) -> list[Example]:
    """The default model's training set: seed :data:`TRAIN_SEED`, segment lengths
    :data:`TRAIN_PREMISE_DISTRACTORS` / :data:`TRAIN_HYPOTHESIS_DISTRACTORS`."""
    return generate(count, TRAIN_SEED, premise_distractors=TRAIN_PREMISE_DISTRACTORS,
                    hypothesis_distractors=TRAIN_HYPOTHESIS_DISTRACTORS)


def write(path: str | Path, examples: list[Example]) -> None:
    """Write ``examples`` as a TSV with a header row of :data:`TSV_COLUMNS`; the label is written by
    name, the two list columns as JSON."""
    path = Path(path)
    try:
        with replaced(path, make_parents=False) as tmp, tmp.open("w", encoding="utf-8", newline="") as fh:
            w = csv.writer(fh, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, quotechar=None)
            w.writerow(TSV_COLUMNS)
            for ex in examples:
                w.writerow([ex.text_a, ex.text_b if ex.text_b is not None else "",
                            LABELS[ex.label] if ex.label is not None else "", strict_dumps(ex.meta.get("pair")),
                            strict_dumps(ex.meta.get("pair_word_index"))])
    except OSError as e:
        raise DataError(f"cannot write {path}: {e}") from e
    except OptionError as e:  # the output rule's one line (fileio.write_failed), as a data error here
        raise DataError(str(e)) from None


_check_words()
