"""`attattr merge`: join shards written by separate processes or machines."""

from __future__ import annotations

from pathlib import Path

import typer

from ..store import merge as merge_stores
from .common import edge, err, out


def merge(
    shards: list[Path] = typer.Argument(..., help="Shard stores written with the same model and options."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Store to create or extend."),
) -> None:
    """Merge shard stores into one (same model, data and options required)."""
    with edge():
        result = merge_stores([str(s) for s in shards], str(out_path))
        err.print(f"merged {result['added']} examples ({result['skipped']} already present)", markup=False)
        out.print(str(out_path), markup=False)
