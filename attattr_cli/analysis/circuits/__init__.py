"""Which heads carry a behaviour: head-ranking methods and MIB's faithfulness evaluation
(docs/circuits.md). A head method is one registered :class:`HeadMethod` computing each pair's
score of every head (``[pairs, layer, head]``, larger = the head carries more of the clean
behaviour, in units of the metric). Adding a method is one module under this package that
calls :func:`register`; the CLI's ``--methods`` list and ``all``, the JSON and the docs table
read this registry. The modules import NumPy only at the top (torch inside the functions), so
that ``attattr --help`` stays quick.
"""

from __future__ import annotations

from .registry import REGISTRY, HeadMethod, register  # noqa: F401

# the method modules register themselves; their order is the order of tables and --help
from . import gates, atp, patching, tiers, verified, nap_ig, pattern, attention, baseline  # noqa: E402,F401

NAMES = REGISTRY.built_in()  # the built-in methods; plugins' are in REGISTRY once it is read
RECOMMENDED = "atp-verified"  # its rule fixed on tuning pairs, then measured on held-out tasks: docs/circuits.md
DEFAULT = tuple(dict.fromkeys((RECOMMENDED,) + REGISTRY.built_in(lambda m: m.default)))


def parse_methods(spec: str | None) -> tuple[str, ...]:
    """``None`` -> the default set; ``all``; or a comma-separated list of registered names.
    The recommended method is always computed."""
    return REGISTRY.parse(spec, DEFAULT, first=RECOMMENDED)


def markdown_table() -> str:
    """The methods table of docs/circuits.md (a test keeps the two equal)."""
    rows = ["| method | kind | what it computes | cost per pair | MLP nodes | reference |", "|---|---|---|---|---|---|"]
    for m in REGISTRY.values():
        star = " (recommended)" if m.name == RECOMMENDED else ""
        mlp = "yes" if m.mlp else "no"
        rows.append(f"| `{m.name}`{star} | {m.kind} | {m.description} | {m.passes(None)} | {mlp} | {m.reference} |")
    return "\n".join(rows)
