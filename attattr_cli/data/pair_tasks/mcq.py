"""Multiple-choice pairs in MIB's style."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import Pair, one_token, pair_task, token_length


MCQ_CATEGORIES = {
    "fruit": ("apple", "banana", "orange", "pear", "grape", "lemon", "cherry", "peach"),
    "animal": ("dog", "cat", "horse", "cow", "sheep", "rabbit", "mouse", "lion"),
    "colour": ("red", "blue", "green", "yellow", "purple", "brown", "pink", "white"),
    "tool": ("hammer", "saw", "drill", "wrench", "shovel", "knife", "axe", "rake"),
}
MCQ_TEMPLATE = "Question: Which of these is a {category}? A. {a} B. {b} C. {c} Answer:"


@pair_task("mcq", "multiple choice: the right option's letter, the options reordered",
           "multiple-choice pairs of equal token length", reference="MIB (multiple-choice tasks)")
def mcq(tokenizer):
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
        if token_length(tokenizer, clean) != token_length(tokenizer, cf):
            return None
        return Pair(i, clean, cf, (letters[options.index(right)],), (letters[moved.index(right)],),
                    {"task": "mcq", "category": category})

    return make
