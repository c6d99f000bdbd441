"""Indirect-object identification (IOI) pairs."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import pair_task, usable_names

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


@pair_task("ioi", "indirect-object identification: the name not repeated, against the repeated one",
           "IOI pairs of equal token length", IOI_TEMPLATES, reference="Wang et al. 2022 (as MIB uses it)")
def ioi(tokenizer):
    """Indirect-object identification: "When Mary and John went to the store, John gave a drink
    to" -> " Mary" against " John"; the counterfactual puts three other names in (the ABC
    distribution), so that it carries no information about which name is the answer."""
    names = usable_names(tokenizer)
    if len(names) < 5:
        raise DataError(f"only {len(names)} of the IOI names are one token for this tokenizer (5 needed)")
    def fill(rng):
        io, s, c1, c2, c3 = rng.sample(names, 5)
        both = {"PLACE": rng.choice(PLACES), "OBJECT": rng.choice(OBJECTS)}
        first, second = (io, s) if rng.random() < 0.5 else (s, io)
        return {"A": first, "B": second, "S": s, **both}, {"A": c1, "B": c2, "S": c3, **both}, " " + io, " " + s

    return fill
