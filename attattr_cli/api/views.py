"""Pictures and summaries of a store: ``view`` (one example as PNG, SVG, PDF or an HTML page),
``report`` (the whole store as an offline HTML page or folder) and ``info`` (what a store
holds). The commands `attattr view`, `report` and `info` are these functions and a print."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import OptionError
from .model import progress_for
from .results import open_store


@dataclass
class Picture:
    """A drawn example: ``data`` (the file's bytes), ``format``, ``path`` (where it was
    written; None when not), and the ``view`` drawn (layers, heads, the maps' window)."""

    data: bytes
    format: str
    path: str | None
    view: Any


def _shows(show) -> list[str]:
    from ..views import SHOWS

    items = [show] if isinstance(show, str) else list(show)
    out = []
    for item in items:
        for s in (x.strip() for x in str(item).split(",") if x.strip()):
            s = "attr" if s in ("attribution", "attributions") else s
            if s not in SHOWS:
                raise OptionError(f"unknown show '{s}'; available: {', '.join(SHOWS)}")
            out.append(s)
    return out or list(SHOWS)


def _check_out(out) -> None:
    """Refuse an output whose folder is missing or that is a folder, before any work."""
    p = Path(out)
    if p.is_dir():
        raise OptionError(f"out {out} is a folder: give a file name such as view.html")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.exists():
        raise OptionError(f"out {out}: the folder {parent} does not exist")


def view(store, example: int, out=None, *, fmt: str | None = None, layers: Sequence[int] | None = None,
         heads="sum", show=("attr", "attention"), queries: Sequence[int] | None = None, window: int | None = None,
         top_k: int | None = None, importance: str | None = None, family: str | None = None,
         tree: bool = True, aggregate: str | None = None, steps: bool = True, per_layer: bool = False) -> Picture:
    """Draw example ``example`` of ``store``: attribution and attention heatmaps per layer, the
    text coloured by token importance, the top interactions, the prediction and the
    completeness residual (docs/views.md). ``fmt`` png, svg, pdf or html (default: from
    ``out``'s extension); ``out`` (optional) is written whole or not at all; the bytes are
    returned either way. ``aggregate="words"`` merges subword tokens into words
    (analysis/aggregate.py). A generation scored step by step is drawn as its step x source
    matrix (views/steps.py; words unless ``aggregate="tokens"``, one panel per layer more with
    ``per_layer``); ``steps=False`` draws its summed maps as for any example."""
    from ..fileio import write_atomic
    from ..views import format_of, from_store, render_bytes, spec_of

    if out is None and fmt is None:
        raise OptionError("give out (a .png, .svg, .pdf or .html file) or fmt")
    fmt = format_of(None if out is None else str(out), fmt)
    if out is not None:
        _check_out(out)
    spec = spec_of(layers=None if layers is None else list(layers), heads=heads, show=_shows(show),
                   queries=None if queries is None else list(queries), window=window, top_k=top_k,
                   importance=importance)
    if aggregate not in (None, "words", "tokens"):
        raise OptionError(f"unknown aggregation '{aggregate}'; use words or tokens")
    with open_store(store) as s:
        loaded = from_store(s.store, int(example), family=family)
    if steps and getattr(loaded.example, "steps", None):  # a generation: the step x source matrix
        from ..views.steps import step_bytes

        data, sv = step_bytes(loaded.example, fmt, words=aggregate != "tokens", per_layer=per_layer,
                              title=f"attattr view: {Path(store).name}, example {example}")
        if out is not None:
            write_atomic(out, data)
        return Picture(data, fmt, None if out is None else str(out), sv)
    if aggregate == "words":
        loaded = _words(loaded)
    spec.num_layers = loaded.num_layers
    data, v = render_bytes(loaded.example, fmt, loaded.labels, spec, loaded.token_importance, tree=tree,
                           num_layers=loaded.num_layers, title=f"attattr view: {Path(store).name}, example {example}")
    if out is not None:
        write_atomic(out, data)
    return Picture(data, fmt, None if out is None else str(out), v)


def _words(loaded):
    """The loaded example and its stored token importance over words (analysis/aggregate.py)."""
    import dataclasses

    from ..analysis.aggregate import aggregate_example, membership, merge_vector

    e = aggregate_example(loaded.example, "words")
    p = membership(e.meta["aggregate"]["groups"], len(loaded.example.tokens))
    ti = {k: merge_vector(v, p) for k, v in (loaded.token_importance or {}).items()}
    return dataclasses.replace(loaded, example=e, token_importance=ti)


def report(store, out, *, importance=None, family: str | None = None, progress=None):
    """Write the report of a whole store to ``out`` (a .html file, or a folder DIR/ for large
    stores): provenance, a sortable and filterable table of the examples (text, gold,
    prediction, probability, residual, flags: wrong, large residual, truncated, not
    converged) and each example's view one click away; offline. Written whole or not at all.
    Returns what was written (path, folder, examples, bytes, flagged counts)."""
    from ..views.report import build_report

    with open_store(store) as s, progress_for(progress, "report") as bar:
        return build_report(s.store, out, importance=importance, family=family, progress=bar)


def info(store) -> dict:
    """What a store holds (the JSON of `attattr info --json`): model, options, examples,
    accuracy, completeness residuals, and per attention family the integration's nodes,
    error estimates and convergence (which example-layers did not converge, and why)."""
    with open_store(store) as s:
        return s.info()
