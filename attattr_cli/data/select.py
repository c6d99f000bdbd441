"""Selection of examples by index: ``--examples 0:100``, ``3,7,9``, ``0:10,20,30:40``."""

from __future__ import annotations

import re

from attattr_cli.errors import OptionError

_INT = r"[+-]?\d+"
_INDEX = re.compile(_INT)
_SLICE = re.compile(rf"({_INT})?:({_INT})?(?::({_INT})?)?")


def _out_of_range(index: int, total: int) -> OptionError:
    if total == 0:
        return OptionError(f"example {index} is out of range: the data has no examples")
    noun = "example" if total == 1 else "examples"
    return OptionError(
        f"example {index} is out of range: the data has {total} {noun} (0..{total - 1})"
    )


def parse_examples(spec: str | None, total: int) -> list[int]:
    """The 0-based indices selected by ``spec`` among ``total`` examples.

    None selects all. ``spec`` is a comma-separated list of items, each an index
    (``7``, ``-1`` counts from the end as in Python) or a slice ``start:stop`` or
    ``start:stop:step`` with Python's semantics (bounds may be left out and are
    clipped to the data: ``:50``, ``100:``, ``0:100:2``, ``::-1``). Repeated
    indices are kept once, at their first place. Raises OptionError for a
    malformed item, an index out of range, a zero step, or a selection that
    selects nothing.
    """
    if spec is None:
        return list(range(total))
    if not spec.strip():
        raise OptionError("empty example selection: give indices or slices such as 0:100 or 3,7,9")
    selected: list[int] = []
    seen: set[int] = set()
    for raw in spec.split(","):
        piece = raw.strip()
        if _INDEX.fullmatch(piece):
            value = int(piece)
            if not -total <= value < total:
                raise _out_of_range(value, total)
            indices: range | list[int] = [value % total]
        else:
            match = _SLICE.fullmatch(piece)
            if match is None:
                if not piece:
                    raise OptionError(f"bad example selection '{spec}': an empty item between commas")
                raise OptionError(
                    f"bad example selection '{spec}': '{piece}' is neither an index (such as 7) "
                    f"nor a slice (such as 0:100 or 0:100:2)"
                )
            start, stop, step = (int(g) if g is not None else None for g in match.groups())
            if step == 0:
                raise OptionError(f"bad example selection '{spec}': slice '{piece}' has step 0")
            indices = range(total)[slice(start, stop, step)]
        for index in indices:
            if index not in seen:
                seen.add(index)
                selected.append(index)
    if not selected:
        raise OptionError(f"example selection '{spec}' selects no examples (the data has {total})")
    return selected
