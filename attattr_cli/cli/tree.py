"""`attattr tree`: the attribution tree of one example, as DOT, JSON, PNG or SVG."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..api.results import TREE_TAU, open_store, tree as build_tree
from ..errors import OptionError
from . import options
from .common import edge, err, parse_int_list, renamed_options

FORMATS = ("dot", "json", "png", "svg")
EXTENSIONS = {".dot": "dot", ".gv": "dot", ".json": "json", ".png": "png", ".svg": "svg"}


def _format(fmt: Optional[str], out_path: Optional[str]) -> str:
    if fmt is not None:
        if fmt not in FORMATS:
            raise OptionError(f"unknown --format '{fmt}'; available: {', '.join(FORMATS)}")
        return fmt
    if out_path in (None, "-"):
        return "dot"
    ext = Path(out_path).suffix.lower()
    if ext not in EXTENSIONS:
        raise OptionError(f"cannot tell the format from '{out_path}': give --format ({', '.join(FORMATS)})")
    return EXTENSIONS[ext]


def tree(
    store: Path = typer.Argument(..., help="An attattr HDF5 store (from `attattr score` or `attattr import-json`)."),
    example: Optional[int] = typer.Option(None, "--example", "-n", help="Index of the example in the store (required)."),
    tau: float = typer.Option(TREE_TAU, "--tau", help="Keep edges whose layer-normalised score exceeds tau."),
    lam: Optional[float] = typer.Option(None, "--lambda", help="Cost per edge (the paper's lambda): edges must also score above it. Paper mode only."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Layers to walk, e.g. 0,2 or 6:12 (default: all scored layers)."),
    root: Optional[int] = typer.Option(None, "--root", help="Root the tree at this token position instead of the top-node rule (where does this token's information come from?)."),
    compat: str = typer.Option("paper", "--compat", help="paper (default) or reference (the 2021 code's procedure, step for step)."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="dot (default), json, png or svg; inferred from -o's extension."),
    out_path: Optional[str] = typer.Option(None, "--out", "-o", help="File to write (default: stdout; PNG and SVG need -o when stdout is a terminal)."),
    family: Optional[str] = typer.Option(None, "--family", help="Attention family of an encoder-decoder store: encoder (default) or decoder; cross has no tree."),
    aggregate: Optional[str] = typer.Option(None, "--aggregate", help="words: word nodes (subword tokens merged, their maps summed over merged queries and keys)."),
    step: Optional[int] = typer.Option(None, "--step", help="A generation scored step by step: the tree of this step (its prefix; default: the summed maps)."),
    quiet: bool = options.quiet("No summary line on stderr."),
    example_e: Optional[int] = typer.Option(None, "-e", hidden=True, help="Old spelling of --example."),
    top: Optional[int] = typer.Option(None, "--top", hidden=True, help="Old spelling of --root."),
) -> None:
    """Build the attribution tree of one example (Hao et al. 2021; docs/method.md section 3).

    Writes DOT on stdout by default, so `attattr tree scores.h5 -n 3 | dot -Tpng > tree.png`
    works; PNG and SVG are rendered with Graphviz's dot. Edges point from a token (query) to the
    token it takes information from (key); arrows show the flow up to the top node.
    """
    with edge():
        example = options.once(example, example_e, "--example", "-e")
        if example is None:
            raise OptionError("give the example to draw: --example N (-n N)")
        root = options.once(root, top, "--root", "--top")
        fmt = _format(fmt, out_path)
        to_stdout = out_path in (None, "-")
        if to_stdout and fmt in ("png", "svg") and sys.stdout.isatty():
            raise OptionError(f"{fmt.upper()} output goes to a file: give -o tree.{fmt} (or pipe stdout)")
        layers = parse_int_list(layers, "--layers")  # before the store opens
        with open_store(store) as s, renamed_options("compat", "family"):
            e = s.get(example, family=family)
            if step is not None:
                if not e.steps or not -len(e.steps) <= step < len(e.steps):
                    raise OptionError(f"example {example} has {len(e.steps or [])} generation steps; --step {step}"
                                      " is not one of them")
                e = e.steps[step]
            if aggregate not in (None, "tokens"):
                e = e.aggregate(aggregate)
            t = build_tree(e, tau=tau, lam=lam, layers=layers, root=root, compat=compat,
                           num_layers=s.store.num_layers(e.family),
                           title=f"{Path(store).name}, example {example}" + ("" if step is None else f", step {step}"))
        if to_stdout:
            sys.stdout.flush()
            sys.stdout.buffer.write(t.to_bytes(fmt))
            sys.stdout.buffer.flush()
        else:
            t.save(out_path, fmt)
        if not quiet:
            g = t.graph
            edges = g.number_of_edges()
            err.print(f"example {example}: {g.number_of_nodes()} of {len(g.graph['tokens'])} tokens in the tree,"
                      f" top node {t.title.rsplit('top node ', 1)[-1]}, {edges} edge{'' if edges == 1 else 's'}"
                      f" ({compat} mode, tau {tau:g}); {fmt} to {'stdout' if to_stdout else out_path}", markup=False)
