"""`attattr merge`: join shards written by separate processes or machines."""

from __future__ import annotations

from pathlib import Path

import typer

from ..api import merge as merge_stores
from . import options
from .common import edge, err, out
from ..api.inputs import strict_dumps  # strict JSON: no NaN or Infinity


def merge(
    shards: list[Path] = typer.Argument(..., help="Shard stores written with the same model, data and options (e.g. scores.rank*-of-4.h5)."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Store to create or extend."),
    partial: bool = typer.Option(False, "--partial", help="Merge what is there even if a torchrun shard was interrupted or a rank's shard is not given."),
    as_json: bool = options.as_json("Print a JSON summary on stdout (out, added, skipped, shards, notes, problems) instead of the path."),
    quiet: bool = options.quiet("No notes or summary on stderr (errors still)."),
) -> None:
    """Merge shard stores into one (same model, data and options required).

    Shards of a torchrun run (`attattr score` under torchrun, on machines that do not share a
    disk) are checked for completeness: a shard that lacks examples its process was given, or
    a rank whose shard is not given, is refused unless --partial. An example in several shards
    is taken once. A new --out is written under a temporary name and renamed when complete.
    Prints --out's path on stdout (with --json, a summary).
    """
    with edge():
        result = merge_stores([str(s) for s in shards], str(out_path), partial=partial)
        notes, problems = result.pop("notes"), result.pop("problems")
        for note in [] if quiet else notes:
            err.print(f"Note: {note}", markup=False)
        for problem in problems:
            err.print(f"Warning: {problem}; merged what is there (--partial)", markup=False)
        if not quiet:
            err.print(f"merged {result['added']} examples ({result['skipped']} already present)", markup=False)
        if as_json:
            summary = dict(out=str(out_path), **result, notes=notes, problems=problems)
            out.print(strict_dumps(summary, indent=2), markup=False)
        else:
            out.print(str(out_path), markup=False)
