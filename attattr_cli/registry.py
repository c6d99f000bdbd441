"""One registry class for every family of methods (head methods of ``attattr circuit``, token
importance methods of ``attattr faithfulness``, ...): entries by name, in registration order,
each a frozen dataclass with at least ``name``.

A family is ``Registry("head method")``; a module adds an entry with ``REGISTRY.register(...)``.

NumPy-free and torch-free: importing it costs nothing.
"""

from __future__ import annotations

from typing import Any, Iterator

from .errors import OptionError

class Registry:
    """Entries of one family by name, in registration order (a read-only mapping)."""

    def __init__(self, what: str):
        self.what = what  # "head method", "token importance method": how errors name an entry
        self._entries: dict[str, Any] = {}

    def register(self, entry):
        name = entry.name
        if name in self._entries or name == "all":
            raise ValueError(f"{self.what} '{name}' is registered twice")
        self._entries[name] = entry
        return entry

    # the mapping interface (what callers used of the plain dicts before)
    def __getitem__(self, name: str):
        return self._entries[name]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: str, default=None):
        return self._entries.get(name, default)

    def keys(self):
        return self._entries.keys()

    def values(self):
        return self._entries.values()

    def items(self):
        return self._entries.items()

    def names(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def unknown(self, name: str) -> OptionError:
        """The one-line error for a name that is not registered."""
        return OptionError(f"unknown {self.what} {name!r}; available: {', '.join(self._entries)} (or all)")

    def parse(self, spec: str | None, default: tuple[str, ...], first: str | None = None) -> tuple[str, ...]:
        """``None`` -> ``default``; ``all``; or a comma-separated list of registered names (order
        kept, duplicates dropped; ``first``, when given, is always computed and comes first)."""
        if spec is None:
            return default
        names = [s.strip() for s in spec.split(",") if s.strip()]
        if not names:
            raise OptionError(f"methods is empty; give one or more of: {', '.join(self._entries)} (or all)")
        if names == ["all"]:
            return self.names()
        for n in names:
            if n not in self._entries:
                raise self.unknown(n)
        return tuple(dict.fromkeys(([first] if first else []) + names))
