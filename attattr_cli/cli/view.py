"""`attattr view`: the picture of one stored example (PNG, SVG, PDF or interactive HTML)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from ..errors import OptionError
from . import options
from .common import edge, err, parse_int_list, renamed_options


def _layers(spec: Optional[str]):
    if spec is not None and spec.strip() == "all":
        return "all"
    return parse_int_list(spec, "--layers")


def view(
    store: Path = typer.Argument(..., help="An attattr HDF5 store (from `attattr score`)."),
    example: int = typer.Option(..., "--example", "-n", help="Index of the example in the store."),
    out_path: str = typer.Option(..., "--out", "-o", help="File to write: .png, .svg, .pdf or .html (interactive); - writes SVG or HTML to stdout."),
    fmt: Optional[str] = typer.Option(None, "--format", "-f", help="png, svg, pdf or html (default: from -o's extension; html for -o -)."),
    layers: Optional[str] = typer.Option(None, "--layers", help="Layers to draw, e.g. 0,3 or 6:12 or all (default: every scored layer, or of more than 6 the 6 that hold the most |attribution|, the others named in the picture)."),
    heads: str = typer.Option("sum", "--heads", help="sum (default: the head sum; attention: the head mean), all, or one head number."),
    show: str = typer.Option("attr,attention", "--show", help="Maps to draw: attr, attention or both (default)."),
    queries: Optional[str] = typer.Option(None, "--queries", help="Query positions to centre the map on (long inputs), e.g. 120 or -1."),
    window: Optional[int] = typer.Option(None, "--window", help="Query positions shown around each of --queries (default 16)."),
    top_k: Optional[int] = typer.Option(None, "--top-k", help="Rows of the top interactions table (default 10)."),
    importance: Optional[str] = typer.Option(None, "--importance", help="Token importance to colour the text by: attr-colsum (default) or a method `attattr faithfulness` stored."),
    family: Optional[str] = typer.Option(None, "--family", help="Attention family of an encoder-decoder store: encoder (default), decoder or cross."),
    tree: bool = typer.Option(True, "--tree/--no-tree", help="Add the attribution tree, with its legend (needs Graphviz's dot)."),
    aggregate: Optional[str] = typer.Option(None, "--aggregate", help="words: merge subword tokens into words (maps summed over merged queries and keys); tokens: as scored. A generation's step x source view shows words unless --aggregate tokens."),
    steps: bool = typer.Option(True, "--steps/--whole", help="A generation scored step by step: the step x source matrix (default), or --whole for its summed maps as for any example."),
    per_layer: bool = typer.Option(False, "--per-layer", help="Step x source view: one more panel per layer."),
    quiet: bool = options.quiet("No summary line on stderr."),
) -> None:
    """Draw one stored example: attribution and attention heatmaps per layer, the text coloured
    by token importance, the top interactions, the prediction and the completeness residual.

    The extension picks the format: PNG, SVG and PDF are figures; HTML is an interactive,
    offline page (choose layer and head, hover a cell, click a token). Long inputs show a
    window around --queries (or the positions that predict an LM's target), never an n x n image.
    """
    with edge():
        from ..api.views import view as draw

        to_stdout = out_path == "-"
        if to_stdout and (fmt or "html") not in ("svg", "html"):
            raise OptionError(f"{fmt.upper()} goes to a file: give -o view.{fmt} (stdout takes svg or html)")
        with renamed_options("out", "fmt", "show"):
            picture = draw(store, example, None if to_stdout else out_path, fmt=(fmt or "html") if to_stdout else fmt,
                           layers=_layers(layers), heads=heads, show=show, queries=parse_int_list(queries, "--queries"),
                           window=window, top_k=top_k, importance=importance, family=family, tree=tree,
                           aggregate=aggregate, steps=steps, per_layer=per_layer)
        if to_stdout:
            sys.stdout.flush()
            sys.stdout.buffer.write(picture.data)
            sys.stdout.buffer.flush()
        v = picture.view
        if not quiet and hasattr(v, "rows"):  # a generation's step x source matrix
            err.print(f"example {example}: {len(v.rows)} generated {'words' if v.words else 'tokens'} x"
                      f" {len(v.columns)} sources; {picture.format} to {'stdout' if to_stdout else out_path}",
                      markup=False)
        elif not quiet:
            shown = (f"{len(v.q_idx)}x{len(v.k_idx)} of {len(v.query_tokens)}x{len(v.key_tokens)} tokens"
                     if v.maps else "no maps, the top-k table")
            err.print(f"example {example} ({v.family}): layers {','.join(map(str, v.layers))}, heads {heads}, "
                      f"{'+'.join(v.maps) or 'top-k'} ({v.mode}: {shown}); {picture.format} to"
                      f" {'stdout' if to_stdout else out_path}", markup=False)
