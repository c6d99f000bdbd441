"""Views: pictures of one stored example and a browsable report of a store (docs/views.md).

Functions here read an example by duck typing (the attributes of
``attattr_cli.store.StoredExample``), take label names separately, never print, and
import neither torch nor (until a figure is drawn) matplotlib."""

from __future__ import annotations

import copy
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

from ..errors import OptionError
from ..fileio import write_atomic
from .data import COLSUM, SHOWS, View, ViewSpec, build_view
from .still import highlight_html

FORMATS = ("png", "svg", "pdf", "html")

__all__ = ["FORMATS", "SHOWS", "View", "ViewSpec", "Loaded", "build_view", "example_html", "from_store",
           "highlight_html", "prediction_line", "render_bytes", "save", "show", "spec_of", "tree_dot", "tree_svg",
           "view_figure_of", "COLSUM"]


@dataclass
class Loaded:
    """An example read for viewing, with what the view needs from its store."""

    example: object
    labels: list
    token_importance: dict
    num_layers: int | None
    source: str = ""


def from_store(store, index: int, family: str | None = None, provenance: dict | None = None) -> Loaded:
    """Read example ``index`` (family ``family``) of an open ``attattr_cli.store.Store``
    (``provenance``: the store's, when the caller has read it already)."""
    from ..store import read_token_importance

    e = store.get(index, family=family)
    prov = provenance if provenance is not None else store.provenance
    labels = list(prov.get("label_names") or prov.get("task_labels") or [])
    fams = prov.get("families")
    num_layers = fams[e.family].get("layers") if isinstance(fams, dict) and isinstance(fams.get(e.family), dict) \
        else prov.get("num_layers")
    ti = read_token_importance(store, index)
    return Loaded(e, labels, ti, num_layers if isinstance(num_layers, int) else None, Path(store.path).name)


def spec_of(layers=None, heads="sum", show=SHOWS, queries=None, window=None, top_k=None, importance=None,
            num_layers=None) -> ViewSpec:
    """A :class:`ViewSpec` from keyword options (None: the default)."""
    if isinstance(layers, str) and layers != "all":
        raise OptionError(f"bad layers '{layers}': give layer numbers or all")
    spec = ViewSpec(layers=layers, heads=heads if heads is not None else "sum", queries=queries,
                    importance=importance, num_layers=num_layers)
    if show is not None:
        spec.show = [show] if isinstance(show, str) else list(show)
    if window is not None:
        if window < 1:
            raise OptionError(f"--window must be at least 1, got {window}")
        spec.window = window
    if top_k is not None:
        if top_k < 0:
            raise OptionError(f"--top-k must be at least 0, got {top_k}")
        spec.top_k = top_k
    return spec


def tree_dot(example, num_layers: int | None = None, title: str | None = None,
             labels: Sequence[str] | None = None) -> str | None:
    """The attribution tree as DOT text (with a legend and the prediction), or None when
    Graphviz's dot is missing or the example has no tree (the cross family, no maps or sums)."""
    if shutil.which("dot") is None or getattr(example, "family", "self") == "cross":
        return None
    from ..analysis.tree import node_label, tree_for_example, tree_to_dot

    e = example
    if e.attribution is None and getattr(e, "head_sum", None) is not None:  # only sums kept: the tree sums heads
        e = copy.copy(example)
        e.attribution = example.head_sum
    if e.attribution is None:
        return None
    g = tree_for_example(e, num_layers=num_layers)
    return tree_to_dot(g, title=title or f"example {example.index}: top node {node_label(g, g.graph['top'])}",
                       prediction=prediction_line(example, labels))


def prediction_line(example, labels: Sequence[str] | None = None) -> str:
    """The header's line as the tree's title shows it: ``gold neutral · prediction neutral
    (p 0.998) · attributed F = p(neutral) = 0.998``; for a generation's step its own step,
    token and probability (views/data.py ``header_of``)."""
    from .data import header_of

    return header_of(example, labels)["summary"]


def tree_svg(example, num_layers: int | None = None, title: str | None = None,
             labels: Sequence[str] | None = None) -> str | None:
    """The attribution tree as SVG text, or None (see :func:`tree_dot`)."""
    from ..analysis.tree import render

    dot = tree_dot(example, num_layers, title, labels)
    return None if dot is None else render(dot, "svg").decode("utf-8")


def _view_and_data(example, labels, spec, token_importance, tree: bool, num_layers, fmt: str):
    spec = spec or ViewSpec()
    if fmt == "html" and spec.max_layers is not None:  # the page switches layers: every one is in it
        spec = replace(spec, max_layers=None)
    if num_layers is not None and spec.num_layers is None:
        spec.num_layers = num_layers
    view = build_view(example, labels, spec, token_importance)
    if fmt != "html":
        if not tree:
            return view, None
        from ..analysis.tree import render

        dot = tree_dot(example, spec.num_layers, labels=labels)
        return view, (None if dot is None else render(dot, "png"))
    from .html import view_data

    svg = tree_svg(example, spec.num_layers, labels=labels) if tree else None
    data = view_data(example, labels, spec, token_importance, tree_svg=svg,
                     view=view if spec.heads in (None, "sum") else None)
    return view, data


def example_html(example, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
                 token_importance: dict | None = None, tree: bool = True, num_layers: int | None = None,
                 **options) -> str:
    """The interactive view of one example as an HTML fragment (for ``_repr_html_``).
    ``options`` are :func:`spec_of`'s keywords (layers, heads, show, queries, window, top_k, importance)."""
    from .html import fragment_html

    spec = spec or spec_of(**options)
    _, data = _view_and_data(example, labels, spec, token_importance, tree, num_layers, "html")
    return fragment_html(data)


def show(example, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
         token_importance: dict | None = None, tree: bool = True, num_layers: int | None = None,
         **options) -> None:
    """Display the view in a notebook, once (returns None: nothing to display a second time);
    without IPython an OptionError says to use :func:`save`."""
    from .notebook import Html, display

    text = example_html(example, labels, spec, token_importance, tree, num_layers, **options)
    display(Html(text, f"view of example {example.index}"))


def view_figure_of(example, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
                   token_importance: dict | None = None, tree: bool = True, num_layers: int | None = None,
                   **options):
    """The view of one example as a matplotlib ``Figure`` (what :func:`save` draws for PNG)."""
    from .figure import view_figure

    spec = spec or spec_of(**options)
    view, tree_png = _view_and_data(example, labels, spec, token_importance, tree, num_layers, "png")
    return view_figure(view, tree_png)


def format_of(path: str | Path | None, fmt: str | None = None) -> str:
    if fmt is not None:
        fmt = fmt.lower().lstrip(".")
        if fmt not in FORMATS:
            raise OptionError(f"unknown --format '{fmt}'; available: {', '.join(FORMATS)}")
        return fmt
    if path in (None, "-"):
        raise OptionError("writing to stdout needs --format svg or --format html")
    ext = Path(path).suffix.lower().lstrip(".")
    ext = "html" if ext == "htm" else ext
    if ext not in FORMATS:
        raise OptionError(f"cannot tell the format from '{path}': use a .png, .svg, .pdf or .html name, or --format")
    return ext


def render_bytes(example, fmt: str, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
                 token_importance: dict | None = None, tree: bool = True, num_layers: int | None = None,
                 title: str = "attattr view", dpi: int = 150) -> tuple[bytes, View]:
    """The view in ``fmt`` (png, svg, pdf or html) as bytes, with the :class:`View` drawn
    (``dpi``: a PNG's resolution)."""
    if fmt not in FORMATS:
        raise OptionError(f"unknown format '{fmt}'; available: {', '.join(FORMATS)}")
    view, data = _view_and_data(example, labels, spec, token_importance, tree, num_layers, fmt)
    if fmt == "html":
        from .html import page_html

        return page_html(data, title).encode("utf-8"), view
    from .figure import figure_bytes

    return figure_bytes(view, fmt, dpi=dpi, tree_png=data), view


def save(example, path: str | Path, labels: Sequence[str] | None = None, spec: ViewSpec | None = None,
         token_importance: dict | None = None, tree: bool = True, num_layers: int | None = None,
         fmt: str | None = None, **options) -> View:
    """Write the view of one example to ``path``: PNG, SVG, PDF or HTML by ``fmt`` or the
    suffix; written whole or not at all. Returns the :class:`View` that was drawn."""
    fmt = format_of(path, fmt)
    spec = spec or spec_of(**options)
    data, view = render_bytes(example, fmt, labels, spec, token_importance, tree, num_layers,
                              title=f"attattr view: example {example.index}")
    write_atomic(path, data)
    return view
