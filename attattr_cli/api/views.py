"""Pictures and summaries of a store: ``view`` (one example as PNG, SVG, PDF or an HTML page),
``report`` (the whole store as an offline HTML page or folder) and ``info`` (what a store
holds). The commands `attattr view`, `report` and `info` are these functions and a print."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..errors import OptionError
from .checks import File, Int, Ints, Names, OneOf, Out, Progress, Str, checked
from .model import progress_for
from .results import open_store


INLINE_DPI = 72  # a view returned for a notebook (neither out nor fmt): the PNG at a screen's resolution


@dataclass(repr=False)
class Picture:
    """A drawn example: ``data`` (the file's bytes), ``format``, ``path`` (where it was
    written; None when not), and the ``view`` drawn (layers, heads, the maps' window). A
    notebook shows it (PNG, SVG or the HTML view); ``repr()`` is one line."""

    data: bytes
    format: str
    path: str | None
    view: Any

    def size(self) -> tuple[int, int] | None:
        """(width, height) in pixels of a PNG, None for the other formats."""
        if self.format == "png" and self.data[:8] == b"\x89PNG\r\n\x1a\n" and len(self.data) >= 24:
            return int.from_bytes(self.data[16:20], "big"), int.from_bytes(self.data[20:24], "big")
        return None

    @checked(path=Out())
    def save(self, path) -> Path:
        """Write the bytes to ``path`` (whole or not at all)."""
        from ..fileio import write_atomic

        write_atomic(Path(path), self.data)
        return Path(path)

    def _repr_png_(self) -> bytes | None:
        return self.data if self.format == "png" else None

    def _repr_svg_(self) -> str | None:
        return self.data.decode("utf-8") if self.format == "svg" else None

    def _repr_html_(self) -> str | None:
        if self.format != "html":
            return None
        import html

        # the page in a frame of its own (its script and styles stay inside it)
        return (f'<iframe srcdoc="{html.escape(self.data.decode("utf-8"), quote=True)}" '
                'style="width:100%;height:900px;border:1px solid #ddd"></iframe>')

    def __repr__(self) -> str:
        px = self.size()
        return (f"Picture({self.format}" + (f", {px[0]}x{px[1]} px" if px else "") + f", {len(self.data):,} bytes"
                + (f", path={self.path!r}" if self.path else "") + ")")


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


@checked(store=File(), example=Int(), out=Out(), layers=OneOf(Ints(), Str(choices=("all",))), heads=OneOf(Str(), Int()), show=Names(),
         queries=Ints())
def view(store, example: int, out=None, *, fmt: str | None = None, layers: Sequence[int] | None = None,
         heads="sum", show=("attr", "attention"), queries: Sequence[int] | None = None, window: int | None = None,
         top_k: int | None = None, importance: str | None = None, family: str | None = None,
         tree: bool = True, aggregate: str | None = None, steps: bool = True, per_layer: bool = False):
    """Draw example ``example`` of ``store``: attribution and attention heatmaps per layer, the
    text coloured by token importance, the top interactions, the prediction and the
    completeness residual (docs/views.md). ``fmt`` png, svg, pdf or html (default: from
    ``out``'s extension, png without ``out``); ``out`` (optional) is written whole or not at
    all; a :class:`Picture` holding the bytes is returned either way (a notebook shows it).
    ``fmt="figure"`` returns a matplotlib ``Figure`` instead. ``layers``: layer numbers,
    ``"all"``, or None: every scored layer, or of more than 6 the 6 with the largest total
    |attribution| (the picture names the others; docs/views.md). ``aggregate="words"`` merges
    subword tokens into words (analysis/aggregate.py). A generation scored step by step is
    drawn as its step x source matrix (views/steps.py; words unless ``aggregate="tokens"``,
    one panel per layer more with ``per_layer``); ``steps=False`` draws its summed maps as for
    any example."""
    from ..fileio import check_output, write_atomic
    from ..views import format_of, from_store, render_bytes, spec_of

    as_figure = isinstance(fmt, str) and fmt.lower() == "figure"
    if as_figure and out is not None:
        raise OptionError("fmt figure returns a matplotlib Figure: leave out out (fig.savefig writes it)")
    inline = out is None and fmt is None  # for a notebook: a small PNG, at a screen's resolution
    fmt = "png" if as_figure or inline else format_of(None if out is None else str(out), fmt)
    if out is not None:
        check_output(out, [store, importance], "out")  # a folder or a missing folder: refused by Out()
    spec = spec_of(layers=layers if layers is None or isinstance(layers, str) else list(layers), heads=heads,
                   show=_shows(show), queries=None if queries is None else list(queries), window=window, top_k=top_k,
                   importance=importance)
    if aggregate not in (None, "words", "tokens"):
        raise OptionError(f"unknown aggregation '{aggregate}'; use words or tokens")
    with open_store(store) as s:
        loaded = from_store(s.store, int(example), family=family)
    title = f"attattr view: {Path(store).name}, example {example}"
    if steps and getattr(loaded.example, "steps", None):  # a generation: the step x source matrix
        from ..views.steps import step_bytes

        data, drawn = step_bytes(loaded.example, fmt, words=aggregate != "tokens", per_layer=per_layer, title=title)
    else:
        if aggregate == "words":
            loaded = _words(loaded)
        spec.num_layers = loaded.num_layers
        if as_figure:
            from ..views import view_figure_of

            return view_figure_of(loaded.example, loaded.labels, spec, loaded.token_importance, tree=tree,
                                  num_layers=loaded.num_layers)
        data, drawn = render_bytes(loaded.example, fmt, loaded.labels, spec, loaded.token_importance, tree=tree,
                                   num_layers=loaded.num_layers, title=title, dpi=INLINE_DPI if inline else 150)
        if inline:  # shown in a notebook, not written: the same picture on a 256-colour palette
            from ..analysis.plots import compact_png

            data = compact_png(data)
    if out is not None:
        write_atomic(out, data)
    return Picture(data, fmt, None if out is None else str(out), drawn)


def _words(loaded):
    """The loaded example and its stored token importance over words (analysis/aggregate.py)."""
    import dataclasses

    from ..analysis.aggregate import aggregate_example, membership, merge_vector

    e = aggregate_example(loaded.example, "words")
    p = membership(e.meta["aggregate"]["groups"], len(loaded.example.tokens))
    ti = {k: merge_vector(v, p) for k, v in (loaded.token_importance or {}).items()}
    return dataclasses.replace(loaded, example=e, token_importance=ti)


@checked(store=File(), out=Out(either=True), importance=File(), progress=Progress())
def report(store, out, *, importance=None, family: str | None = None, progress=None):
    """Write the report of a whole store to ``out`` (a .html file, or a folder DIR/ for large
    stores): provenance, a sortable and filterable table of the examples (text, gold,
    prediction, probability, residual, flags: wrong, large residual, truncated, not
    converged; a store of generations: prompt, generated words, steps, foil, the largest
    residual of a step and layer, flags from the steps) and each example's view one click
    away (a generation's text, step x source matrix and steps; views/steps.py); offline. Written whole or not at all.
    Returns what was written (path, folder, examples, bytes, flagged counts)."""
    from ..fileio import check_output
    from ..views.report import build_report

    check_output(out, [store, importance], "out")

    with open_store(store) as s, progress_for(progress, "report") as bar:
        return build_report(s.store, out, importance=importance, family=family, progress=bar)


@checked(store=File())
def info(store) -> dict:
    """What a store holds (the JSON of `attattr info --json`): model, options, examples,
    accuracy, completeness residuals, and per attention family the integration's nodes,
    error estimates and convergence (which example-layers did not converge, and why)."""
    with open_store(store) as s:
        return s.info()
