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


def _items(spec: str) -> list[tuple[str, int | slice]]:
    """The items of a selection (an index or a slice each); OptionError for a malformed one."""
    if not spec.strip():
        raise OptionError("empty example selection: give indices or slices such as 0:100 or 3,7,9")
    out: list[tuple[str, int | slice]] = []
    for raw in spec.split(","):
        piece = raw.strip()
        if _INDEX.fullmatch(piece):
            out.append((piece, int(piece)))
            continue
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
        out.append((piece, slice(start, stop, step)))
    return out


def check_spec(spec: str | None) -> None:
    """Check a selection's syntax before the data is read (OptionError as parse_examples gives)."""
    if spec is not None:
        if not isinstance(spec, str):
            raise OptionError(f"examples must be a selection such as '0:100' or '3,7,9', got {spec!r}")
        _items(spec)


def beyond(spec: str | None, total: int) -> list[int]:
    """The indices a selection names explicitly that the data does not have: a slice's stop or
    an index past the end (Python's slices clip them silently; a user asking for 0:205 of 200
    rows wants to hear that 5 are missing)."""
    if spec is None:
        return []
    missing: list[int] = []
    for _piece, item in _items(spec):
        if isinstance(item, slice) and (item.step is None or item.step > 0) and item.stop is not None \
                and item.stop > total:
            start = max(item.start or 0, total) if (item.start or 0) >= 0 else total
            missing.extend(range(start, item.stop, item.step or 1))
    return missing


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
    selected: list[int] = []
    seen: set[int] = set()
    for piece, item in _items(spec):
        if isinstance(item, int):
            if not -total <= item < total:
                raise _out_of_range(item, total)
            indices: range | list[int] = [item % total]
        else:
            indices = range(total)[item]
        for index in indices:
            if index not in seen:
                seen.add(index)
                selected.append(index)
    if not selected:
        raise OptionError(f"example selection '{spec}' selects no examples (the data has {total})")
    return selected
