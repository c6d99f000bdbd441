"""The token importance methods, one registered :class:`Method` each (docs/faithfulness.md,
"The registry"). Adding a method is one module under this package that calls
:func:`register`; the CLI's ``--methods`` list and ``all``, the JSON and the docs table read
this registry. The modules import NumPy only at the top (torch inside the functions), so that
``attattr --help`` stays quick.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from ...errors import OptionError
from ...registry import Registry

VERSION = 1  # the version stored with every method's numbers unless a method says otherwise


@dataclass(frozen=True)
class Settings:
    """What a run of the faithfulness command fixes for every method."""

    output: str = "prob"  # the store's target output: prob or logit
    erase: str = "remove"
    seed: int = 0
    score_options: dict | None = None  # the store's scoring options (steps, rule, output)


@dataclass(frozen=True)
class Method:
    name: str
    description: str
    compute: Callable[[Any], Any]  # Context -> [n] float64 scores
    kind: str = "other"  # attention, attribution, gradient, decomposition, perturbation, baseline
    needs: tuple[str, ...] = ()  # "gradients", "attribution", "model"
    params: Callable[[Settings], dict] = field(default=lambda s: {})  # besides "version"
    version: int = VERSION
    requires: tuple[str, ...] = ()  # importable modules (an optional extra)
    applies: Callable[[Any], str | None] | None = None  # loaded model -> why it does not apply, or None
    default: bool = True  # in the default set (the methods of the first faithfulness release)
    reference: str = ""  # the paper, for the docs table

    def missing(self) -> str | None:
        """Why the method cannot run here (a missing optional module), or None."""
        for mod in self.requires:
            if importlib.util.find_spec(mod) is None:
                return f"method '{self.name}' needs the Python module '{mod}', which is not installed"
        return None

    def not_for(self, loaded) -> str | None:
        """Why the method does not apply to this model, or None."""
        return None if self.applies is None else self.applies(loaded)

    def store_params(self, settings: Settings) -> dict:
        return {"version": self.version, **self.params(settings)}


REGISTRY = Registry("token importance method", units="tokens", command="faithfulness")
register = REGISTRY.register


# the method modules register themselves; their order is the order of tables and --help
from . import builtin, ig, decompose, value_zeroing  # noqa: E402,F401

DEFAULT = REGISTRY.built_in(lambda m: m.default)
NAMES = REGISTRY.built_in()  # the built-in methods (--help); plugins' are in REGISTRY once it is read


def expand(methods: Iterable[str], loaded=None) -> tuple[list[str], list[str]]:
    """``all`` replaced by every available method; returns (methods, notes on those left out)."""
    out: list[str] = []
    notes: list[str] = []
    for m in methods:
        if m == "all":
            for meth in REGISTRY.values():
                why = meth.missing() or (None if loaded is None else meth.not_for(loaded))
                if why:
                    notes.append(f"{meth.name} left out: {why}")
                elif meth.name not in out:
                    out.append(meth.name)
        elif m not in out:
            out.append(m)
    return out, notes


def check(methods: Iterable[str]) -> list[str]:
    """Validate method names (order kept, duplicates dropped; ``all`` kept for :func:`expand`)."""
    out: list[str] = []
    for m in methods:
        m = m.strip()
        if not m:
            continue
        if m != "all" and m not in REGISTRY:
            raise OptionError(f"unknown token importance method '{m}'; available: {', '.join(REGISTRY)}, all")
        if m != "all" and REGISTRY[m].missing():
            raise OptionError(REGISTRY[m].missing())
        if m not in out:
            out.append(m)
    if not out:
        raise OptionError("no token importance method given; available: " + ", ".join(REGISTRY) + ", all")
    return out


def check_applies(methods: Iterable[str], loaded) -> None:
    for m in methods:
        why = REGISTRY[m].not_for(loaded)
        if why:
            raise OptionError(f"method '{m}' does not apply to this model: {why}")


def markdown_table() -> str:
    """The registry as the Markdown table of docs/faithfulness.md (a test keeps them equal)."""
    lines = ["| method | kind | needs | in the default set | paper | description |",
             "| --- | --- | --- | --- | --- | --- |"]
    for m in REGISTRY.values():
        needs = ", ".join(m.needs) or "–"
        if m.requires:
            needs += " (Python module " + ", ".join(m.requires) + ")"
        if m.applies is not None:
            needs += "; BERT-style encoders only"
        lines.append(f"| `{m.name}` | {m.kind} | {needs} | {'yes' if m.default else 'no'} | {m.reference or '–'} | "
                     f"{m.description} |")
    return "\n".join(lines) + "\n"
