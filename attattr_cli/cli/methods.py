"""`attattr methods`: every registered method, built-in and plugged in (docs/extending.md)."""

from __future__ import annotations

from typing import Optional

import typer

from . import options
from .common import edge, out

SHOWN = ("command", "units", "method", "kind", "cost", "reference")


def methods(
    command: Optional[str] = typer.Argument(None, help="Only the entries of this command: circuit, importance, faithfulness, sources-check, 'demo data', 'score --task' or 'circuit --ablation'."),
    as_json: bool = options.as_json(),
) -> None:
    """List the methods (and the tasks and ablations) each command accepts: the units they score, their cost, their paper.

    Methods that other packages add through the Python entry point group attattr.methods are
    listed with the built-in ones (docs/extending.md). Prints a table on stdout, or JSON with --json.
    """
    with edge():
        from ..api.methods import methods as listing

        found = listing(command)
        if as_json:
            print(found.to_json())
            return
        rows = [[str(r[c]) for c in SHOWN] for r in found.rows]
        widths = [max(len(x) for x in col) for col in zip(SHOWN, *rows)]
        for row in [list(SHOWN)] + rows:
            out.print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip(), markup=False, highlight=False,
                      soft_wrap=True)
        if found.plugins:
            out.print("plugins: " + ", ".join(found.plugins), markup=False, highlight=False)
