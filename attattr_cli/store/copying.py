"""A store's examples copied into a new store: the file ``score(..., out=)`` writes for them."""

from __future__ import annotations

import os
from pathlib import Path

from ..errors import StoreError
from .opening import copy_root, open_file
from .schema import EXAMPLES, example_name


def copy_examples(source: str | os.PathLike, out: str | os.PathLike, indices: list[int]) -> Path:
    """Write the examples ``indices`` of the store ``source`` to a new store ``out`` (whole or
    not at all): the same root attributes, provenance and every other root item, and those
    examples' groups as they are stored. ``out`` must not be ``source``."""
    from ..fileio import replaced

    source, out = Path(source), Path(out)
    if out.exists() and out.resolve() == source.resolve():
        raise StoreError(f"{out} is the store these examples come from: give another file name")
    with open_file(source, "r", locking=False) as src, replaced(out, suffix=".h5") as tmp:
        with open_file(tmp, "w") as dst:
            examples = copy_root(src, dst)
            for i in indices:
                name = example_name(int(i))
                if name not in src[EXAMPLES]:
                    raise StoreError(f"example {i} is not in {source}")
                src.copy(src[EXAMPLES][name], examples, name=name)
    return out
