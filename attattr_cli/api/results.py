"""What the API returns for examples: one attribution per example, stores, trees."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

import numpy as np

from ..analysis.tree import DEFAULT_TAU as TREE_TAU  # noqa: F401  (the CLI's default)
from ..errors import OptionError, StoreError
from ..store import Store, StoredExample
from .checks import STORE_SUFFIXES, Array, File, Instance, Int, Ints, OneOf, Out, Str, checked
from ..store.reader import Interaction  # noqa: F401  (re-exported: part of the API)
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity
from .tables import saved


@dataclass
class Attribution(StoredExample):
    """The attribution of one example, as :func:`score` returns it and ``store[i]`` reads it: a
    :class:`~attattr_cli.store.StoredExample` (the same fields and names as ``Store.get`` gives)
    that can also show itself (docs/api.md, "Attribution", lists every field).

    Arrays are numpy: ``attribution`` [layer, head, query, key] (the scored ``layers``),
    ``attention`` [all layers, head, query, key], ``residual`` [layer] (sum of the attribution
    minus F(A) - F(0)), ``head_max`` [layer, head], ``logits`` and ``probs`` [classes]; with
    ``keep="sum"`` the maps are ``None`` and ``head_sum`` [layer, query, key] holds their sum over
    heads. ``gold``, ``pred`` and ``target`` are class indices (-1: unknown). A generation scored
    step by step holds one Attribution per generated token, of its prefix, in ``steps``.
    """

    @classmethod
    def from_stored(cls, e: StoredExample, label_names=None) -> "Attribution":
        """The same example with the API's conveniences."""
        values = {f.name: getattr(e, f.name) for f in fields(StoredExample)}
        values["label_names"] = list(label_names if label_names is not None else (e.label_names or []))
        if values.get("steps"):  # a generation: every step with the same conveniences
            values["steps"] = [cls.from_stored(st, label_names) for st in values["steps"]]
        return cls(**values)

    def _repr_html_(self) -> str:
        """The interactive view (heatmaps per layer, coloured tokens, top interactions) in a
        notebook; for a generation its text, step x source matrix and steps (a still picture:
        inline SVG and styles, no script; views/steps.py ``step_still``)."""
        if self.steps:
            from ..views.steps import step_still

            return step_still(self) + (self._sources_html() if self._has_sources() else "")
        if self._sources_only():
            return self._sources_html()
        from ..views import example_html

        return example_html(self, self.label_names)

    def _has_sources(self) -> bool:
        return isinstance(self.meta, dict) and bool((self.meta.get("sources") or {}).get("spans"))

    def _sources_only(self) -> bool:
        """Kept with ``keep="sources"``: no maps, no head sums, the passages' scores."""
        return self.attribution is None and self.head_sum is None and self._has_sources()

    def _sources_html(self) -> str:
        from ..views.sources import sources_html

        return sources_html(self)

    @checked(path=Out(), top=Int(min=1))
    def plot_sources(self, path=None, top: int | None = None):
        """An example scored with ``sources=``: its passages as bars (their scores in the
        prompt's order, the top three numbered by rank; ``top``: only the ``top`` highest), keys
        outside the passages said in the title, as a matplotlib ``Figure``, also written to
        ``path`` (.png, .svg, .pdf; whole or not at all) when given."""
        from ..analysis.sources import spans_of
        from ..views.sources import sources_figure

        spans_of(self)  # one line where it has none
        return saved(sources_figure(self, top), path)

    @checked(path=Out())
    def plot(self, path=None, words: bool = True, per_layer: bool = False):
        """A generation's step x source matrix (what ``attattr view`` draws for it: rows the
        generated words, or tokens with ``words=False``; one panel per layer more with
        ``per_layer``) as a matplotlib ``Figure``, also written to ``path`` (.png, .svg, .pdf;
        whole or not at all) when given. An example kept with ``keep="sources"``: its passages'
        bars (:meth:`plot_sources`). Any other example: the view's figure (:meth:`figure`)."""
        if self.steps:
            from ..views.steps import step_figure, step_view

            view, by_layer = step_view(self, words)
            return saved(step_figure(view, by_layer if per_layer else None), path)
        if self._sources_only():
            return self.plot_sources(path)
        return saved(self.figure(), path)

    def show(self, **options) -> None:
        """Display the interactive view in a notebook (once; returns None); ``options``: layers,
        heads ("sum", "all" or an index), show ("attr", "attention"), queries, window, top_k
        (see docs/views.md). A generation without options: what it shows as a result (its
        text, step x source matrix and steps); with options, its summed maps' view."""
        if self.steps and not options:
            from ..views.notebook import Html, display
            from ..views.steps import step_still

            return display(Html(step_still(self), f"generation of example {self.index}"))
        from ..views import show

        show(self, self.label_names, **options)

    def figure(self, **options):
        """The view as a matplotlib ``Figure`` (``options`` as for :meth:`show`); ``fig.savefig``
        or ``fig.save(path)`` writes it."""
        from ..views import view_figure_of

        return view_figure_of(self, self.label_names, **options)

    @checked(path=Out())
    def save(self, path, **options):
        """Write ``path`` by its suffix: ``.h5``/``.hdf5`` the example as an attribution store
        (the store ``score(..., out=)`` writes; every command reads it), else the view as PNG,
        SVG, PDF or a standalone HTML page (``options`` as for :meth:`show`). Written whole or
        not at all. A generation without options: its step x source view, what ``attattr
        view`` writes for it (returns the drawn ``StepView``)."""
        if Path(path).suffix.lower() in STORE_SUFFIXES:
            return save_store([self], path)
        if self.steps and not options:
            from ..fileio import write_atomic
            from ..views import format_of
            from ..views.steps import step_bytes

            data, view = step_bytes(self, format_of(path), title=f"attattr view: example {self.index}")
            write_atomic(path, data)
            return view
        from ..views import save

        return save(self, path, self.label_names, **options)

    @checked(how=OneOf(Str(), Instance(list, tuple, what="a list of (start, end) spans")),
             word_ids=Instance(list, tuple, what="a list of word indices (or None) per token"))
    def aggregate(self, how="words", word_ids=None) -> "Attribution":
        """The same example over words (``"words"``; ``word_ids`` from the tokenizer, one word
        index or None per token, else the tokens' word-boundary markers) or user spans (a list
        of (start, end) token positions, end exclusive): maps summed over merged queries and
        keys, so completeness still holds (docs/views.md, "Words"). Per-step results follow."""
        from ..analysis.aggregate import aggregate_example

        return aggregate_example(self, how, word_ids)

    @checked()
    def step_source(self, words: bool = True):
        """A generation's step x source matrix: (matrix [generated, sources], row labels,
        column labels), rows the generated words (tokens with ``words=False``), entries their
        token importance (NaN outside a step's prefix)."""
        from ..analysis.aggregate import step_source

        matrix, rows, cols, _f, _layers = step_source(self, words)
        return matrix, rows, cols

    @checked(scores=Array())
    def highlight(self, scores=None):
        """The text's tokens coloured green (positive) or red (negative) by ``scores`` (default:
        :meth:`token_importance`): an object a notebook shows as coloured tokens, whose
        ``str()`` is the HTML (inline styles only, no script)."""
        from ..views import highlight_html

        from ..labels import example_labels

        return highlight_html(example_labels(self)[1], self.token_importance() if scores is None else scores)

    @checked(aggregate=OneOf(Str(), Instance(list, tuple, what="a list of (start, end) spans")))
    def to_pandas(self, table: str | None = None, aggregate=None):
        """A pandas DataFrame: ``table="heads"`` one row per scored layer and head (columns in
        docs/api.md), ``"tokens"`` one row per (key) token with its importance (with
        ``aggregate="words"``, or a list of spans as :meth:`aggregate` takes, one row per word,
        its importance the sum of its tokens'), ``"steps"`` (a generation's default) one row
        per generated token: step, token, target value, foil, residual, convergence; ``"sources"``
        (an LM scored with ``sources=...``) one row per source: ``source``, ``start``, ``end``
        (token positions, end exclusive), ``text``, ``score`` (its keys' attribution summed over
        layers, heads and queries; for a generation over the steps too) and for a generation one
        ``step_t`` column per step (docs/long-context.md)."""
        table = table or ("steps" if self.steps else "heads")
        if table == "sources":
            from ..analysis.sources import SOURCE_COLUMNS, source_rows, step_columns
            from ..views.notebook import data_frame

            return data_frame(source_rows(self), SOURCE_COLUMNS + step_columns(self))
        return _frame([self], table, aggregate)

    def __repr__(self) -> str:
        if self.steps:
            from ..views.steps import facts

            f = facts(self)
            from ..labels import visible

            gen = visible(f["generated"])
            gen = gen if len(gen) <= 40 else gen[:39] + "…"
            bad = len(f["unconverged"])
            return (f"Attribution(index={self.index}, generation of {f['steps']} steps ({f['how']}), "
                    f"generated={gen!r}" + (f", foil={f['foil']!r}" if f["foil"] is not None else "")
                    + f", target {f['target']}, max |step residual| {f['max_residual'] or 0.0:.2e}"
                    + (f", {bad} step-layers not converged" if bad else "") + ")")
        text = self.text_a if self.text_b is None else f"{self.text_a} / {self.text_b}"
        text = text if len(text) <= 60 else text[:59] + "…"
        from ..labels import ranges

        step = (self.meta or {}).get("step") if isinstance(self.meta, dict) else None
        at = f"step {step['step']}" + (f" of {step['of']}" if step.get("of") else "") + ", " if isinstance(step, dict) else ""
        return (f"Attribution(index={self.index}, {at}{len(self.tokens)} tokens, prediction={self.prediction!r}, "
                f"{self.attributed}, layers {ranges(self.layers)}, text={text!r})")


HEAD_COLUMNS = ["example", "layer", "head", "head_max", "head_sum", "layer_residual", "converged",
                "prediction", "gold"]
TOKEN_COLUMNS = ["example", "position", "token", "piece", "importance"]


def _columns(table: str) -> list[str]:
    from ..views.steps import STEP_COLUMNS

    from ..analysis.sources import SOURCE_COLUMNS

    if table not in ("heads", "tokens", "steps", "sources"):
        raise OptionError(f"table must be heads, tokens, steps or sources, got {table!r}")
    return {"heads": HEAD_COLUMNS, "tokens": TOKEN_COLUMNS, "steps": STEP_COLUMNS,
            "sources": ["example"] + SOURCE_COLUMNS}[table]


def _frame(examples, table: str, aggregate=None):
    """The DataFrame of ``table`` over ``examples``; the steps table names a foil only when one
    was used."""
    from ..views.notebook import data_frame

    rows, columns = _rows_of(examples, table, aggregate), _columns(table)
    if table == "steps" and all(r["foil"] is None for r in rows):
        columns = [c for c in columns if c not in ("foil", "foil_probability")]
    return data_frame(rows, columns)


def head_rows(e) -> list[dict]:
    """Per scored (layer, head) of one example: ``head_max`` (the largest entry of the head's
    attribution map, what head importance averages), ``head_sum`` (the map's sum; None when
    no maps are kept), the layer's completeness ``layer_residual`` and ``converged``."""
    hm = np.asarray(e.head_max, dtype=np.float64) if e.head_max is not None else None
    sums = (np.asarray(e.attribution, dtype=np.float64).sum(axis=(2, 3))
            if e.attribution is not None and np.ndim(e.attribution) == 4 else None)
    resid = np.asarray(e.residual, dtype=np.float64).ravel()
    bad = e.unconverged_layers
    rows = []
    for li, layer in enumerate(e.layers):
        heads = hm.shape[1] if hm is not None and hm.ndim == 2 else (0 if sums is None else sums.shape[1])
        for h in range(heads):
            rows.append({"example": int(e.index), "layer": int(layer), "head": h,
                         "head_max": None if hm is None else float(hm[li, h]),
                         "head_sum": None if sums is None else float(sums[li, h]),
                         "layer_residual": float(resid[li]) if li < resid.size else None,
                         "converged": int(layer) not in bad, "prediction": e.prediction, "gold": e.gold_label})
    return rows


def token_rows(e, aggregate=None) -> list[dict]:
    """Per (key) token of one example: its position, label, piece and importance (the attribution
    summed over layers, heads and queries). ``aggregate`` "words" (or spans): per word, its
    position among the words and its importance the sum of its tokens' (analysis/aggregate.py)."""
    if aggregate is not None and not (isinstance(aggregate, str) and aggregate == "tokens"):
        from ..analysis.aggregate import aggregate_example

        e = aggregate_example(e, aggregate)
    from ..labels import example_labels

    pieces = e.key_tokens or e.tokens
    keys = example_labels(e)[1]  # as a reader sees them (labels.py); ``piece`` as the tokenizer wrote them
    values = e.token_importance()
    return [{"example": int(e.index), "position": i, "token": t, "piece": str(p), "importance": float(v)}
            for i, (t, p, v) in enumerate(zip(keys, pieces, values))]


def _rows_of(examples, table: str, aggregate=None) -> list[dict]:
    from ..views.steps import step_rows

    _columns(table)
    if isinstance(aggregate, str):
        from ..analysis.aggregate import words_asked

        words_asked(aggregate)
    if table == "heads" and aggregate is not None and aggregate != "tokens":
        raise OptionError("aggregate goes with table='tokens' (the head table has no tokens to merge)")
    rows: list[dict] = []
    for e in examples:
        if table == "steps" and not e.steps:
            raise OptionError(f"example {e.index} is not a generation scored step by step: it has no steps table"
                              " (score it with generate=N, or continuation=... with per_step=True)")
        if table == "sources":
            from ..analysis.sources import source_rows

            rows += [{"example": int(e.index), **r} for r in source_rows(e)]
            continue
        rows += head_rows(e) if table == "heads" else token_rows(e, aggregate) if table == "tokens" else step_rows(e)
    return rows


EXAMPLE_COLUMNS = ["index", "text", "gold", "prediction", "probability", "max |residual|", "converged"]


def probability(e) -> float | None:
    """The probability of the prediction; for a language model known only where the prediction
    is the (single) target token: the store keeps the target's probability, not the arg-max's.
    None when unknown."""
    probs = np.asarray(e.probs, dtype=np.float64).ravel()
    meta = e.meta if isinstance(e.meta, dict) else {}
    if meta.get("lm"):
        same = probs.size == 1 and int(e.pred) == int(e.target)
        return float(probs[0]) if same else None
    pred = int(e.pred) if e.pred is not None else -1
    return float(probs[pred]) if 0 <= pred < probs.size else None


GENERATION_COLUMNS = ["index", "prompt", "generated", "steps", "foil", "max |step residual|", "converged"]


def generation_row(e) -> list:
    """[index, prompt, generated, steps, foil, largest |residual| of a step, every step converged] of a generation."""
    from ..views.steps import facts

    f = facts(e)
    prompt = e.text_a if len(e.text_a) <= 60 else e.text_a[:59] + "…"
    return [int(e.index), prompt, f["generated"], f["steps"], f["foil"], f["max_residual"], not f["unconverged"]]


def rows_and_columns(examples) -> tuple[list[list], list[str]]:
    """The rows and columns of a notebook's table of ``examples``: generations (every example
    one) by :func:`generation_row`, else :func:`example_row`."""
    if examples and all(e.steps for e in examples):
        return [generation_row(e) for e in examples], GENERATION_COLUMNS
    return [example_row(e) for e in examples], EXAMPLE_COLUMNS


def example_row(e) -> list:
    """[index, text, gold, prediction, probability, max |residual|, converged] of one example."""
    text = e.text_a if e.text_b is None else f"{e.text_a} / {e.text_b}"
    p = probability(e)
    resid = np.abs(np.asarray(e.residual, dtype=np.float64))
    return [int(e.index), text if len(text) <= 80 else text[:79] + "…", e.gold_label, e.prediction, p,
            float(resid.max()) if resid.size else None, e.converged]


def save_store(examples, path) -> Path:
    """Write scored examples to the attribution store ``path`` (whole or not at all): the file
    ``score(..., out=path)`` writes for them (copied from the store they were read from, which
    :func:`score` keeps while its results live). Returns the path."""
    from ..store.copying import copy_examples

    if Path(path).suffix.lower() not in STORE_SUFFIXES:
        raise OptionError(f"a store is an HDF5 file: give a .h5 name, not {Path(path).name}")
    sources = {str(getattr(e, "backing", None)) for e in examples}
    if not examples or len(sources) != 1 or "None" in sources:
        raise OptionError("save writes examples scored together (one score() call or one store); "
                          "these come from " + ("nowhere" if not examples else f"{len(sources)} sources"))
    indices = [int(e.index) for e in examples]
    if len(set(indices)) != len(indices):
        raise OptionError("save: the same example index appears twice")
    return copy_examples(sources.pop(), path, indices)


class Results(list):
    """A list of :class:`Attribution`, one per input in order, as :func:`score` returns them;
    ``save("x.h5")`` writes them as the store ``score(..., out="x.h5")`` would, ``to_pandas()``
    tabulates them, a notebook shows a table of the examples."""

    def __getitem__(self, i):
        got = super().__getitem__(i)
        return Results(got) if isinstance(i, slice) else got  # a slice saves and shows as the whole does

    @checked(path=Out())
    def save(self, path) -> Path:
        """Write these examples to the attribution store ``path`` (.h5), whole or not at all:
        the store ``score(..., out=path)`` writes, readable by every command. Returns the path."""
        return save_store(list(self), path)

    @checked()
    def to_pandas(self, table: str | None = None, aggregate: str | None = None):
        """A pandas DataFrame over every example: ``table`` and ``aggregate`` as
        :meth:`Attribution.to_pandas` takes them, the rows of each example in turn (``"steps"`` the
        default when every example is a generation; columns in docs/api.md)."""
        table = table or ("steps" if self and all(e.steps for e in self) else "heads")
        return _frame(self, table, aggregate)

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        return table_html(*rows_and_columns(self), title=f"{len(self)} scored examples")

    @checked(how=OneOf(Str(), Instance(list, tuple, what="a list of (start, end) spans")))
    def aggregate(self, how="words") -> "Results":
        """Every example over words or spans (:meth:`Attribution.aggregate`)."""
        return Results(a.aggregate(how) for a in self)

    def __repr__(self) -> str:
        if not self:
            return "Results(0 examples)"
        if all(e.steps for e in self):
            from ..views.steps import facts

            gens = [facts(e)["generated"] for e in self[:3]]
            return (f"Results({len(self)} generations, indices {self[0].index}..{self[-1].index}, "
                    f"layers {list(self[0].layers)}, steps {[len(e.steps) for e in self[:5]]}"
                    f"{' …' if len(self) > 5 else ''}, generated {gens}{' …' if len(self) > 3 else ''})")
        preds = [e.prediction for e in self[:5]]
        return (f"Results({len(self)} examples, indices {self[0].index}..{self[-1].index}, "
                f"layers {list(self[0].layers)}, predictions {preds}{' …' if len(self) > 5 else ''})")


class TemporaryStore:
    """A store file in a temporary folder of its own, removed with the last object holding it
    (or by :meth:`remove`): what :func:`score` reads its results from, kept for their ``save``."""

    def __init__(self, prefix: str):
        import shutil
        import tempfile
        import weakref

        folder = tempfile.mkdtemp(prefix=prefix)
        self.path = Path(folder) / "scores.h5"
        self._finalizer = weakref.finalize(self, shutil.rmtree, folder, True)

    def remove(self) -> None:
        self._finalizer()


def read_all(path, label_names=None) -> Results:
    """Every example of the store at ``path`` as :class:`Attribution` objects (arrays read)."""
    with Store(path) as st:
        names = label_names if label_names is not None else st.provenance.get("label_names") or []
        res = Results(Attribution.from_stored(st.get(i), names) for i in st.indices())
    for e in res:
        e.backing = Path(path).resolve()  # the store save() copies from
    return res


class StoreView:
    """An open attribution store: ``store[i]`` is the example whose index is ``i`` (as
    ``--example i``), ``len(store)``, iteration in index order, ``store.indices``,
    ``store.info()`` (what ``attattr info --json`` prints), ``store.provenance``.
    Close it with ``close()`` or use it in a ``with`` block."""

    def __init__(self, path):
        if not isinstance(path, (str, Path)) or not str(path):
            raise OptionError(f"path must be a store's file path, got {path!r}")
        self.path = Path(path)
        self._store = Store(self.path)
        self.label_names = list(self._store.provenance.get("label_names") or [])

    @property
    def store(self) -> Store:
        """The underlying reader (``attattr_cli.store.Store``)."""
        return self._store

    @property
    def indices(self) -> list[int]:
        """The indices of the examples held, ascending."""
        return list(self._store.indices())

    @property
    def flagged(self) -> list[int]:
        """The examples whose scores hold NaN or inf (flagged ``nonfinite``; analyses skip them)."""
        return list(self._store.flagged())

    @property
    def provenance(self) -> dict:
        """Where the numbers come from: model, data, options, libraries, runs."""
        return self._store.provenance

    @property
    def fingerprint(self) -> dict:
        """What must agree for another run to add to this store."""
        return self._store.fingerprint

    def info(self) -> dict:
        """The store's summary (the JSON of ``attattr info --json``): a dict that shows itself short."""
        from ..views.notebook import Summary

        return Summary(self._store.summary(), "info")

    @checked()
    def get(self, index: int, family: str | None = None) -> Attribution:
        """The example ``index`` (of one attention ``family`` of an encoder-decoder model)."""
        e = Attribution.from_stored(self._store.get(int(index), family=family), self.label_names)
        e.backing = self.path.resolve()
        return e

    def __getitem__(self, index: int) -> Attribution:
        if not isinstance(index, (int, np.integer)):
            raise OptionError(f"store[i] takes an example index, not {type(index).__name__}")
        return self.get(int(index))

    def __len__(self) -> int:
        return len(self._store)

    def __contains__(self, index) -> bool:
        return index in self._store

    def __iter__(self) -> Iterator[Attribution]:
        for i in self.indices:
            yield self.get(i)

    def close(self) -> None:
        """Close the file."""
        self._store.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @checked(examples=Ints())
    def to_pandas(self, table: str | None = None, examples=None, aggregate: str | None = None):
        """A pandas DataFrame over the store's examples (``examples``: a list of indices, default
        all): ``table`` and ``aggregate`` as :meth:`Attribution.to_pandas` takes them, the rows of
        each example in turn (``"steps"`` the default for a store of generations)."""
        chosen = self.indices if examples is None else [int(i) for i in examples]
        if table is None:  # a store's examples are scored alike: the first tells
            table = "steps" if chosen and self._store.get(chosen[0], arrays=False).steps else "heads"
        return _frame((self.get(i) for i in chosen), table, aggregate)

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        rows, columns = rows_and_columns([self._store.get(i, arrays=False) for i in self.indices[:20]])
        return table_html(rows, columns, title=repr(self)) + (
            f"<div style='font-size:smaller'>{len(self) - 20} more examples</div>" if len(self) > 20 else "")

    def __repr__(self) -> str:
        prov = self.provenance
        model = prov.get("model") or "?"
        return (f"StoreView({str(self.path)!r}, {len(self)} examples, model {model!r}, "
                f"{prov.get('num_layers', '?')} layers x {prov.get('num_heads', '?')} heads)")


@checked(path=File())
def open_store(path) -> StoreView:
    """Open an attribution store for reading (see :class:`StoreView`)."""
    return StoreView(path)


class Tree:
    """An attribution tree (Hao et al. 2021, section 3): ``graph`` (a networkx DiGraph whose
    edges point from a token to the token it takes information from), ``edges`` as
    (parent, child, layer) rows, ``top`` (the root position); ``to_dot()``, ``to_json()``,
    ``render("png"|"svg")`` (Graphviz's dot) and ``save(path)`` (format from the extension)."""

    def __init__(self, graph, title: str | None = None, prediction: str | None = None):
        self.graph = graph
        self.title = title
        self.prediction = prediction  # drawn under the title ("neutral (p 0.998), gold neutral")

    @property
    def top(self) -> int:
        """The position of the tree's root token."""
        return int(self.graph.graph["top"])

    @property
    def edges(self) -> list[tuple[int, int, int]]:
        """(parent, child, layer) in the order the edges were added."""
        from ..analysis.tree import tree_edges

        return tree_edges(self.graph)

    def to_dot(self) -> str:
        """The tree in Graphviz DOT."""
        from ..analysis.tree import tree_to_dot

        return tree_to_dot(self.graph, title=self.title, prediction=self.prediction)

    def to_json(self) -> str:
        """The tree as JSON text (nodes, edges, settings)."""
        return strict_dumps(self.to_dict(), indent=2)

    def to_dict(self) -> dict:
        """The tree as a JSON-able dict."""
        from ..analysis.tree import tree_to_json

        return tree_to_json(self.graph)

    @checked()
    def render(self, fmt: str = "svg") -> bytes:
        """The drawing as PNG or SVG bytes (needs Graphviz's ``dot``)."""
        from ..analysis.tree import render

        if fmt not in ("png", "svg"):
            raise OptionError(f"fmt must be png or svg, got '{fmt}'")
        return render(self.to_dot(), fmt)

    @checked()
    def to_bytes(self, fmt: str) -> bytes:
        """The tree as ``fmt``: dot, json, png or svg."""
        if fmt == "dot":
            return self.to_dot().encode()
        if fmt == "json":
            return (self.to_json() + "\n").encode()
        return self.render(fmt)

    @checked(path=Out())
    def save(self, path, fmt: str | None = None) -> Path:
        """Write the tree to ``path`` (whole or not at all): ``fmt`` dot, json, png or svg, by
        default from the suffix (.dot/.gv, .json, .png, .svg)."""
        from ..fileio import write_atomic

        p = Path(path)
        ext = p.suffix.lower()
        fmt = fmt or {".dot": "dot", ".gv": "dot", ".json": "json", ".png": "png", ".svg": "svg"}.get(ext)
        if fmt is None:
            raise OptionError(f"cannot tell the format of {p}: use .dot, .json, .png or .svg")
        data = self.to_bytes(fmt)
        try:
            write_atomic(p, data)
        except OSError as exc:
            raise OptionError(f"cannot write {p}: {exc.strerror or exc}") from None
        return p

    def figure(self):
        """The drawing as a matplotlib ``Figure`` (Graphviz's PNG shown on one axes)."""
        import io

        import matplotlib.image as mpimg

        from ..views.notebook import new_figure

        img = mpimg.imread(io.BytesIO(self.render("png")), format="png")
        h, w = img.shape[:2]
        fig = new_figure(w / 96.0, h / 96.0)
        ax = fig.add_axes((0, 0, 1, 1))
        ax.imshow(img)
        ax.set_axis_off()
        return fig

    def _repr_svg_(self) -> str | None:
        """The drawing in a notebook (None, and the text repr, when Graphviz's dot is missing)."""
        import shutil

        if shutil.which("dot") is None:
            return None
        return self.render("svg").decode("utf-8")

    def __repr__(self) -> str:
        from ..analysis.tree import node_label

        g = self.graph
        return (f"Tree(top {node_label(g, self.top)}, {g.number_of_nodes()} nodes, "
                f"{g.number_of_edges()} edges" + (f", {self.prediction}" if self.prediction else "") + ")")


@checked(example=Instance(StoredExample, what="a scored example (score(...)[i], or open_store(path)[i]: open the store first)"), layers=Ints(),
         num_layers=Int(min=1))
def tree(example, tau: float | None = None, *, lam: float | None = None, layers=None, root: int | None = None,
         compat: str = "paper", num_layers: int | None = None, title: str | None = None) -> Tree:
    """The attribution tree of one example (an :class:`Attribution`, e.g. ``store[3]`` or
    ``score(...)[0]``): edges whose layer-normalised score exceeds ``tau`` (default 0.4);
    ``lam`` the paper's cost per edge; ``layers`` a subset of the scored layers; ``root`` a token
    position to root the tree at instead of the top-node rule; ``compat`` paper or reference;
    ``title`` what the drawing says before "top node ..." (default: the example's index)."""
    from ..analysis.tree import DEFAULT_TAU, MODES, node_label, tree_for_example

    if compat not in MODES:
        raise OptionError(f"unknown compat '{compat}'; available: {', '.join(MODES)}")
    if getattr(example, "family", "self") == "cross":
        raise OptionError("the attribution tree links tokens of one sequence; the cross family (decoder queries,"
                          " encoder keys) has none: give family encoder or decoder")
    if getattr(example, "nonfinite", None):
        raise StoreError(f"example {example.index} holds NaN or inf in its {', '.join(example.nonfinite)}"
                         " (flagged 'nonfinite' in the store): it has no tree")
    if example.attribution is None:
        if example.head_sum is None:
            raise OptionError(f"example {example.index} keeps no attribution maps or head sums (scored with keep "
                              f"{getattr(example, 'keep', None) or 'none'}): score it again with keep sum or keep maps")
        import copy

        example = copy.copy(example)
        example.attribution = example.head_sum
    g = tree_for_example(example, layers=layers, tau=DEFAULT_TAU if tau is None else tau, lam=lam, compat=compat,
                         num_layers=num_layers, top=root)
    from ..views import prediction_line

    return Tree(g, title=f"{title or f'example {example.index}'}: top node {node_label(g, g.graph['top'])}",
                prediction=prediction_line(example, getattr(example, "label_names", None)))
