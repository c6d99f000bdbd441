"""MIB's protocol: the pairs a method may look at apart from the pairs it is judged on.

A :class:`Split` divides a task's pairs, seeded, into the ``fit`` pairs (every method, and any
choice a method makes among candidates, sees only these) and the ``eval`` pairs (the
faithfulness curve, its CPR, CMD and their intervals are measured on these). ``none`` keeps
every pair on both sides: the figures attattr printed before the split existed, labelled so.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ...errors import OptionError

DEFAULT = "half"
KINDS = ("half", "none")  # or a fraction in (0, 1): the share of the pairs the methods see


@dataclass(frozen=True)
class Split:
    kind: str  # "none", "half", or the fraction as given
    seed: int
    fit: tuple[int, ...]  # indices (into the pairs as given) the methods use
    eval: tuple[int, ...]  # indices the curve is measured on

    @property
    def same(self) -> bool:
        """The methods and the curve see the same pairs (``none``)."""
        return self.kind == "none"

    def to_dict(self) -> dict:
        return {"kind": self.kind, "seed": self.seed, "fit": list(self.fit), "eval": list(self.eval),
                "same_pairs": self.same}

    def describe(self) -> str:
        if self.same:
            return f"no split: methods and curve on the same {len(self.fit)} pairs"
        return (f"split {self.kind} (seed {self.seed}): methods see {len(self.fit)} pairs, the curve is measured on "
                f"the other {len(self.eval)}")


def fraction_of(kind: str) -> float | None:
    """The share of pairs the methods see (None for ``none``); OptionError for anything else."""
    if kind == "none":
        return None
    if kind == "half":
        return 0.5
    try:
        f = float(kind)
    except (TypeError, ValueError):
        raise OptionError(f"split must be half, none or a fraction between 0 and 1 (the share of the pairs the "
                          f"methods see), not {kind!r}") from None
    if not 0 < f < 1:
        raise OptionError(f"split {kind!r}: a fraction must lie strictly between 0 and 1")
    return f


def split_pairs(n: int, kind: str = DEFAULT, seed: int = 0) -> Split:
    """Seeded split of ``n`` pairs; each side gets at least one pair."""
    f = fraction_of(str(kind))
    if f is None:
        every = tuple(range(n))
        return Split("none", seed, every, every)
    if n < 2:
        raise OptionError(f"{n} pair cannot be split into pairs for the methods and pairs for the curve: give at "
                          f"least 2 pairs (16 or more for stable figures), or split none")
    k = min(n - 1, max(1, int(round(f * n))))
    order = np.random.default_rng(seed).permutation(n)
    return Split(str(kind), seed, tuple(sorted(order[:k].tolist())), tuple(sorted(order[k:].tolist())))
