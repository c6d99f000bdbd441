"""``methods()``: every registered method of every family, built-in and plugged in (the
``attattr.methods`` entry points, docs/extending.md), with the command that accepts it, the
units it scores, its cost and its reference."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import OptionError
from .checks import Str, checked
from .tables import Table

COLUMNS = ("command", "family", "units", "method", "kind", "cost", "reference", "description")


@dataclass
class Methods(Table):
    """The registered methods, one row each (:data:`COLUMNS`; ``to_pandas()`` one row per
    method); ``plugins`` the entry points loaded and ``failed`` those that did not load."""

    COLUMNS, LIMIT = list(COLUMNS), 200
    rows: list[dict]
    plugins: list[str]
    failed: list[str]

    @checked(command=Str())
    def names(self, command: str | None = None) -> list[str]:
        """The methods' names (of ``command``'s only, when given), in listing order."""
        return [r["method"] for r in self.rows if command is None or r["command"] == command]

    def _rows(self) -> list[dict]:
        return self.rows

    def to_dict(self) -> dict:
        """JSON-able: the rows, the plugins loaded and those that failed."""
        return {"methods": self.rows, "plugins": self.plugins, "failed": self.failed}

    def __repr__(self) -> str:
        counts = {}
        for r in self.rows:
            counts[r["command"]] = counts.get(r["command"], 0) + 1
        plug = f"; plugins: {', '.join(self.plugins)}" if self.plugins else ""
        return "Methods(" + ", ".join(f"{c}: {n}" for c, n in counts.items()) + plug + ")"


@checked(command=Str())
def methods(command: str | None = None) -> Methods:
    """Every registered method (``command``: only those of one command, e.g. ``circuit``,
    ``importance``, ``faithfulness``, ``sources-check``, ``demo data``, ``circuit --ablation``)."""
    from ..analysis.circuits import ablations  # noqa: F401  (each family registers its built-in entries)
    from ..analysis import circuits, context_check, importance, methods as token_methods  # noqa: F401
    from ..data import pair_tasks, tasks  # noqa: F401
    from ..registry import FAMILIES, load_plugins

    state = load_plugins()
    fams = list(FAMILIES)
    known = [f.command for f in fams]
    if command is not None and command not in known:
        raise OptionError(f"unknown command {command!r} for methods; available: {', '.join(known)}")
    rows = [r for f in fams if command in (None, f.command) for r in f.rows()]
    return Methods(rows, list(state["loaded"]), list(state["failed"]))
