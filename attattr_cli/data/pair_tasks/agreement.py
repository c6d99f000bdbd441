"""Agreement pairs: is / are across an attractor."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import Pair, one_token, pair_task, token_length


AGREEMENT_NOUNS = (("key", "keys"), ("dog", "dogs"), ("author", "authors"), ("teacher", "teachers"),
                   ("house", "houses"), ("car", "cars"), ("student", "students"), ("picture", "pictures"),
                   ("farmer", "farmers"), ("book", "books"), ("doctor", "doctors"), ("bird", "birds"))
AGREEMENT_ATTRACTORS = ("near the cabinet", "next to the windows", "behind the trees", "of the old man",
                        "by the river", "beside the chairs", "in the garden", "with the boxes")


@pair_task("agreement", "subject-verb agreement across an attractor", "agreement pairs of equal token length")
def agreement(tokenizer):
    """Subject-verb agreement across an attractor: "The key near the cabinets" -> " is" against
    " are"; the counterfactual makes the subject plural ("The keys ...": the verb flips)."""
    if one_token(tokenizer, " is") is None or one_token(tokenizer, " are") is None:
        raise DataError("this tokenizer does not write ' is' and ' are' as one token each")

    def make(rng, i):
        (sing, plural), attractor = rng.choice(AGREEMENT_NOUNS), rng.choice(AGREEMENT_ATTRACTORS)
        plural_first = rng.random() < 0.5
        a, b = (plural, sing) if plural_first else (sing, plural)
        clean, cf = f"The {a} {attractor}", f"The {b} {attractor}"
        if token_length(tokenizer, clean) != token_length(tokenizer, cf):
            return None
        answer, foil = (" are", " is") if plural_first else (" is", " are")
        return Pair(i, clean, cf, (answer,), (foil,), {"task": "agreement", "noun": sing})

    return make
