"""`attattr merge`: join shards written by separate processes or machines."""

from __future__ import annotations

from pathlib import Path

import typer

from ..store import inspect_shards
from ..store import merge as merge_stores
from .common import edge, err, out


def merge(
    shards: list[Path] = typer.Argument(..., help="Shard stores written with the same model, data and options (e.g. scores.rank*-of-4.h5)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Store to create or extend."),
    partial: bool = typer.Option(False, "--partial", help="Merge what is there even if a torchrun shard was interrupted or a rank's shard is not given."),
) -> None:
    """Merge shard stores into one (same model, data and options required).

    Shards of a torchrun run (`attattr score` under torchrun, on machines that do not share a
    disk) are checked for completeness: a shard that lacks examples its process was given, or
    a rank whose shard is not given, is refused unless --partial. An example in several shards
    is taken once. A new --out is written under a temporary name and renamed when complete.
    """
    with edge():
        check = inspect_shards([str(s) for s in shards])
        for note in check.notes():
            err.print(f"Note: {note}", markup=False)
        for problem in check.problems() if partial else []:
            err.print(f"Warning: {problem}; merging what is there (--partial)", markup=False)
        result = merge_stores([str(s) for s in shards], str(out_path), partial=partial)
        err.print(f"merged {result['added']} examples ({result['skipped']} already present)", markup=False)
        out.print(str(out_path), markup=False)
