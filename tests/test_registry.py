"""The one registry class every method family uses (attattr_cli/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from attattr_cli.errors import OptionError
from attattr_cli.registry import Registry


@dataclass(frozen=True)
class Entry:
    name: str


def test_register_parse_and_refuse():
    reg = Registry("widget method")
    a, b = reg.register(Entry("a")), reg.register(Entry("b"))
    assert list(reg) == ["a", "b"] and reg["a"] is a and "b" in reg and len(reg) == 2 and reg.names() == ("a", "b")
    for bad in ("a", "all"):
        with pytest.raises(ValueError, match="widget method '.*' is registered twice"):
            reg.register(Entry(bad))
    assert reg.parse(None, ("b",)) == ("b",)
    assert reg.parse("all", ()) == ("a", "b")
    assert reg.parse("b, a,b", (), first="a") == ("a", "b")
    with pytest.raises(OptionError, match="unknown widget method 'c'; available: a, b"):
        reg.parse("a,c", ())
    with pytest.raises(OptionError, match="methods is empty"):
        reg.parse(" , ", ())
    assert b is reg.get("b") and reg.get("z") is None


def test_both_method_families_are_registries():
    from attattr_cli.analysis import circuits, methods

    assert isinstance(circuits.REGISTRY, Registry) and isinstance(methods.REGISTRY, Registry)
    assert circuits.register == circuits.REGISTRY.register and methods.register == methods.REGISTRY.register
    assert circuits.REGISTRY.what == "head method" and methods.REGISTRY.what == "token importance method"


def test_source_methods_are_a_registry_and_the_cli_names_them():
    import importlib

    from attattr_cli.analysis import context_check

    assert isinstance(context_check.SOURCE_METHODS, Registry)
    assert context_check.METHODS == context_check.SOURCE_METHODS.names() == ("attattr", "attention",
                                                                             "input_x_gradient", "loo")
    cli = importlib.import_module("attattr_cli.cli.sources_check")
    assert cli.METHODS_HELP == ", ".join(context_check.METHODS)
