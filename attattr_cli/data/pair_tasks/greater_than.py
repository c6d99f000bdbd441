"""Greater-than pairs: years after a given one."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import Pair, one_token, pair_task, token_length


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


@pair_task("greater-than", "the years after a given one against those at or before it",
           "greater-than pairs of equal token length whose last token is the century", reference="Hanna et al. 2023")
def greater_than(tokenizer):
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
        if token_length(tokenizer, cf) != token_length(tokenizer, clean) or any(
                plain(clean + t) != base + [ids[t]] for t in (answer[0], answer[-1], foil[0], foil[-1])):
            return None
        return Pair(i, clean, cf, tuple(answer), tuple(foil), {"task": "greater-than", "year": year, "digits": mode})

    return make
