"""The built-in pair tasks, one module each (data/pairs.py ``PairTask``): a new task is one
module here that registers itself, imported below; its order is the order of listings."""

from __future__ import annotations

from ...errors import DataError
from ..pairs import PAIR_TASKS, Pair
from . import ioi, greater_than, capitals, copying, pronoun, agreement, mcq  # noqa: F401  (they register)


def generate(task: str, tokenizer, count: int, seed: int = 0) -> list[Pair]:
    """``count`` pairs of the registered ``task`` for ``tokenizer``."""
    if task not in PAIR_TASKS:
        raise DataError(f"no pair generator {task!r}; available: {', '.join(sorted(PAIR_TASKS))}")
    if count < 1:
        raise DataError("count must be at least 1")
    return PAIR_TASKS[task].generate(tokenizer, count=count, seed=seed)
