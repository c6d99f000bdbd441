"""Copying pairs: a name seen earlier (an induction task; made to check a ranking on a behaviour it was not built on)."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import pair_task, usable_names


SURNAMES = ("Smith", "Brown", "Jones", "Miller", "Davis", "Wilson", "Taylor", "Clark", "Moore", "White", "Hall",
            "Young", "King", "Wright", "Green", "Baker", "Adams", "Hill", "Scott", "Lee", "Walker", "Allen", "Hughes",
            "Evans", "Turner", "Parker", "Cook", "Morgan", "Bell", "Ward", "Cooper", "Reed")
COPY_TEMPLATES = ("I sat next to {F} {L} at the dinner. After the dinner, {F}",
                  "The letter was signed by {F} {L}. Everyone knew that {F}",
                  "Our new neighbour is called {F} {L}. This morning {F}",
                  "The prize went to {F} {L} last year. This year {F}")


@pair_task("copying", "copying a surname seen earlier (induction)", "copying pairs of equal token length",
           COPY_TEMPLATES)
def copying(tokenizer):
    """Copying a name seen earlier (an induction task): "I sat next to Anna Smith at the dinner.
    After the dinner, Anna" -> " Smith" against " Brown"; the counterfactual names Anna Brown
    instead, so that the copy points at the foil."""
    first = usable_names(tokenizer)
    last = usable_names(tokenizer, SURNAMES)
    if len(first) < 1 or len(last) < 2:
        raise DataError("too few one-token names and surnames for this tokenizer for the copying task")

    def fill(rng):
        f = rng.choice(first)
        l1, l2 = rng.sample(last, 2)
        return {"F": f, "L": l1}, {"F": f, "L": l2}, " " + l1, " " + l2

    return fill
