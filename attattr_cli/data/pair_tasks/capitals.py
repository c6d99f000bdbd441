"""Capitals pairs: a country's capital."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import one_token, pair_task


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
CAPITAL_TEMPLATES = ("The capital of {country} is", "The capital city of {country} is",
                     "{country}'s capital is the city of", "The government of {country} sits in the city of")


@pair_task("capitals", "a fact: a country's capital against another country's", "capital pairs of equal token length",
           CAPITAL_TEMPLATES)
def capitals(tokenizer):
    """A fact: "The capital of France is" -> " Paris" against the capital of the counterfactual's
    country ("The capital of Germany is" -> " Berlin"), a country of the same token length
    whose capital is another city. Only countries whose capital (with a leading space) is one
    token for the tokenizer take part (``COUNTRIES``, about 40)."""
    usable = [(c, cap) for c, cap in COUNTRIES if one_token(tokenizer, " " + cap) is not None]
    if len(usable) < 2:
        raise DataError(f"only {len(usable)} of the capitals are one token for this tokenizer (2 needed)")
    def fill(rng):
        (country, capital), (other, other_capital) = rng.sample(usable, 2)
        if one_token(tokenizer, " " + capital) == one_token(tokenizer, " " + other_capital):
            return None
        return {"country": country}, {"country": other}, " " + capital, " " + other_capital

    return fill
