"""One registry class for every family of methods (head methods, head importance tables, token
importance methods, source methods) and of what they run on (pair tasks, task presets, ablations):
entries by name, in registration order, each a frozen dataclass with at least ``name`` and
``description`` (docs/extending.md lists the families and their commands).

A family is ``Registry("head method", units="heads")``; a module adds an entry with
``REGISTRY.register(...)``. Plugins register through the entry point group ``attattr.methods``,
loaded the first time any registry is read, so a plugin's method appears in every command that
lists or accepts its family. NumPy-free and torch-free: importing it costs nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Iterator

from .errors import OptionError, warn_user

ENTRY_POINT_GROUP = "attattr.methods"
FAMILIES: list["Registry"] = []  # every registry of a command, in creation order (`attattr methods` lists them)
_plugins = {"state": "not loaded", "loaded": [], "failed": []}


def load_plugins() -> dict:
    """Load the ``attattr.methods`` entry points once (a failing one is a one-line warning and
    is left out); returns which loaded and which failed."""
    if _plugins["state"] != "not loaded":
        return _plugins
    _plugins["state"] = "loading"  # a plugin that reads a registry while it loads does not recurse
    from importlib.metadata import entry_points

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj()
            _plugins["loaded"].append(ep.name)
        except Exception as exc:  # noqa: BLE001 - a broken plugin must not break attattr
            _plugins["failed"].append(ep.name)
            warn_user(f"the method plugin {ep.name!r} ({ep.value}) failed to load and is left out: "
                      f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    _plugins["state"] = "loaded"
    return _plugins


class Registry(Mapping):
    """Entries of one family by name, in registration order (a read-only mapping)."""

    __hash__ = object.__hash__  # one registry per family: hashed by identity

    def __init__(self, what: str, units: str = "", command: str = ""):
        self.what = what  # "head method", "token importance method": how errors name an entry
        self.units = units  # what its entries score: heads, tokens, sources
        self.command = command  # the attattr command that lists and accepts them
        self._entries: dict[str, Any] = {}
        if command:
            FAMILIES.append(self)

    def register(self, entry):
        name = entry.name
        if name in self._entries or name == "all":
            raise ValueError(f"{self.what} '{name}' is registered twice")
        self._entries[name] = entry
        return entry

    @property
    def entries(self) -> dict[str, Any]:
        """Every entry, the plugins' included (reading it loads the plugins once)."""
        load_plugins()
        return self._entries

    def __getitem__(self, name: str):
        return self.entries[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.entries)

    def __len__(self) -> int:
        return len(self.entries)

    def names(self) -> tuple[str, ...]:
        return tuple(self.entries)

    def built_in(self, where=None) -> tuple[str, ...]:
        """The names registered so far (``where(entry)`` true, when given), without loading the
        plugins: for ``--help`` texts and defaults, which must stay quick (a run loads them)."""
        return tuple(n for n, e in self._entries.items() if where is None or where(e))

    def unknown(self, name: str) -> OptionError:
        """The one-line error for a name that is not registered."""
        return OptionError(f"unknown {self.what} {name!r}; available: {', '.join(self.entries)} (or all)")

    def parse(self, spec: str | None, default: tuple[str, ...], first: str | None = None) -> tuple[str, ...]:
        """``None`` -> ``default``; ``all``; or a comma-separated list of registered names (order
        kept, duplicates dropped; ``first``, when given, is always computed and comes first)."""
        if spec is None:
            return default
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise OptionError(f"methods is empty; give one or more of: {', '.join(self.entries)} (or all)")
        if names == ["all"]:
            return self.names()
        for n in names:
            if n not in self.entries:
                raise self.unknown(n)
        return tuple(dict.fromkeys(([first] if first else []) + names))

    def rows(self) -> list[dict]:
        """One row per entry, the same columns for every family: what ``attattr methods`` prints."""
        return [{"command": self.command, "family": self.what, "units": self.units, "method": e.name,
                 "kind": getattr(e, "kind", ""), "cost": cost_of(e), "reference": getattr(e, "reference", "") or "",
                 "description": e.description} for e in self.values()]


def cost_of(entry) -> str:
    """An entry's cost in words: its ``cost`` or ``passes`` (text, or a callable of the run's
    settings, called with None), else what it ``needs``."""
    cost = getattr(entry, "cost", None) or getattr(entry, "passes", None)
    if callable(cost):
        return cost(None)
    return cost or ("needs " + ", ".join(entry.needs) if getattr(entry, "needs", None) else "")

