"""Pronoun pairs: he / she after a name."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import one_token, pair_task, usable_names


MALE = ("John", "James", "Michael", "David", "Paul", "Mark", "Tom", "Dan", "Jack", "Ben", "Peter", "George", "Steve",
        "Robert", "Kevin", "Eric", "Andrew", "Joe", "Mike", "Sam")
FEMALE = ("Mary", "Sarah", "Anna", "Lisa", "Kate", "Amy", "Emma", "Laura", "Rachel", "Jessica", "Susan", "Linda",
          "Helen", "Karen", "Julia", "Alice", "Claire", "Sophie", "Lucy", "Grace")
PRONOUN_TEMPLATES = ("{N} was tired after the long trip, so", "When {N} opened the door,",
                     "{N} missed the bus this morning because", "After {N} finished the exam,")


@pair_task("pronoun", "a gendered pronoun after a name", "pronoun pairs of equal token length", PRONOUN_TEMPLATES)
def pronoun(tokenizer):
    """A gendered pronoun: "Mary was tired after the long trip, so" -> " she" against " he"; the
    counterfactual names someone of the other gender (the continuation's pronoun flips)."""
    male, female = usable_names(tokenizer, MALE), usable_names(tokenizer, FEMALE)
    if not male or not female or one_token(tokenizer, " he") is None or one_token(tokenizer, " she") is None:
        raise DataError("this tokenizer lacks one-token names of both genders or the pronouns he / she")

    def fill(rng):
        woman = rng.random() < 0.5
        n, other = (rng.choice(female), rng.choice(male)) if woman else (rng.choice(male), rng.choice(female))
        return ({"N": n}, {"N": other}) + ((" she", " he") if woman else (" he", " she"))

    return fill
