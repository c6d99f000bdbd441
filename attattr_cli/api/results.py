"""What the API returns for examples: one attribution per example, stores, trees."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Iterator

import numpy as np

from ..analysis.tree import DEFAULT_TAU as TREE_TAU, MODES as TREE_MODES  # noqa: F401  (the CLI's defaults)
from ..errors import OptionError, StoreError
from ..store import Store, StoredExample
from ..store.reader import Interaction  # noqa: F401  (re-exported: part of the API)


@dataclass
class Attribution(StoredExample):
    """The attribution of one example, as :func:`score` returns it and ``store[i]`` reads it:
    a :class:`~attattr_cli.store.StoredExample` (the same fields and names as ``Store.get``
    gives) that can also show itself.

    Arrays are numpy: ``attribution`` [layer, head, query, key] (the scored ``layers``),
    ``attention`` [all layers, head, query, key], ``residual`` [layer] (sum of the attribution
    minus F(A) - F(0): the completeness check), ``head_max`` [layer, head], ``logits`` and
    ``probs`` [classes]. ``gold``, ``pred`` and ``target`` are class indices (-1: unknown);
    ``prediction``, ``gold_label`` and ``target_label`` their names. With ``keep="sum"`` the
    maps are ``None`` and ``head_sum`` [layer, query, key] holds their sum over heads.
    Per scored layer, ``nodes``, ``error_estimate`` and ``convergence`` (a state code,
    :attr:`converged` and :attr:`unconverged_layers` read it) say how far the integral can
    be trusted (docs/integration.md).
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
        """The interactive view (heatmaps per layer, coloured tokens, top interactions) in a notebook."""
        from ..views import example_html

        return example_html(self, self.label_names)

    def show(self, **options):
        """Display the interactive view in a notebook; ``options``: layers, heads ("sum", "all"
        or an index), show ("attr", "attention"), queries, window, top_k (see docs/views.md)."""
        from ..views import show

        return show(self, self.label_names, **options)

    def save(self, path, **options):
        """Write the view to ``path``: PNG, SVG, PDF or a standalone HTML page, by the suffix
        (written whole or not at all); ``options`` as for :meth:`show`."""
        from ..views import save

        return save(self, path, self.label_names, **options)

    def aggregate(self, how="words", word_ids=None) -> "Attribution":
        """The same example over words (``"words"``; ``word_ids`` from the tokenizer, one word
        index or None per token, else the tokens' word-boundary markers) or user spans (a list
        of (start, end) token positions, end exclusive): maps summed over merged queries and
        keys, so completeness still holds (docs/views.md, "Words"). Per-step results follow."""
        from ..analysis.aggregate import aggregate_example

        return aggregate_example(self, how, word_ids)

    def step_source(self, words: bool = True):
        """A generation's step x source matrix: (matrix [generated, sources], row labels,
        column labels), rows the generated words (tokens with ``words=False``), entries their
        token importance (NaN outside a step's prefix)."""
        from ..analysis.aggregate import step_source

        matrix, rows, cols, _f, _layers = step_source(self, words)
        return matrix, rows, cols

    def highlight(self, scores=None) -> str:
        """The text's tokens coloured green (positive) or red (negative) by ``scores`` (default:
        :meth:`token_importance`), as HTML; in a notebook, ``IPython.display.HTML(ex.highlight())``."""
        from ..views import highlight_html

        return highlight_html(self.key_tokens or self.tokens,
                              self.token_importance() if scores is None else scores)

    def __repr__(self) -> str:
        text = self.text_a if self.text_b is None else f"{self.text_a} / {self.text_b}"
        return (f"Attribution(index={self.index}, {len(self.tokens)} tokens, prediction={self.prediction!r}, "
                f"layers={list(self.layers)}, text={text[:60]!r})")


class Results(list):
    """A list of :class:`Attribution`, one per input in order, as :func:`score` returns them."""

    def aggregate(self, how="words") -> "Results":
        """Every example over words or spans (:meth:`Attribution.aggregate`)."""
        return Results(a.aggregate(how) for a in self)

    def __repr__(self) -> str:
        return f"Results({len(self)} examples)"


def read_all(path, label_names=None) -> Results:
    """Every example of the store at ``path`` as :class:`Attribution` objects (arrays read)."""
    with Store(path) as st:
        names = label_names if label_names is not None else st.provenance.get("label_names") or []
        return Results(Attribution.from_stored(st.get(i), names) for i in st.indices())


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
        """The store's summary (the JSON of ``attattr info --json``)."""
        return self._store.summary()

    def get(self, index: int, family: str | None = None) -> Attribution:
        """The example ``index`` (of one attention ``family`` of an encoder-decoder model)."""
        return Attribution.from_stored(self._store.get(int(index), family=family), self.label_names)

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

    def __repr__(self) -> str:
        return f"StoreView({str(self.path)!r}, {len(self)} examples)"


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
        from ..analysis.tree import tree_to_json

        return json.dumps(tree_to_json(self.graph), indent=2)

    def to_dict(self) -> dict:
        """The tree as a JSON-able dict."""
        from ..analysis.tree import tree_to_json

        return tree_to_json(self.graph)

    def render(self, fmt: str = "svg") -> bytes:
        """The drawing as PNG or SVG bytes (needs Graphviz's ``dot``)."""
        from ..analysis.tree import render

        if fmt not in ("png", "svg"):
            raise OptionError(f"fmt must be png or svg, got '{fmt}'")
        return render(self.to_dot(), fmt)

    def to_bytes(self, fmt: str) -> bytes:
        """The tree as ``fmt``: dot, json, png or svg."""
        if fmt == "dot":
            return self.to_dot().encode()
        if fmt == "json":
            return (self.to_json() + "\n").encode()
        return self.render(fmt)

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

    def __repr__(self) -> str:
        g = self.graph
        return f"Tree(top={self.top}, {g.number_of_nodes()} nodes, {g.number_of_edges()} edges)"


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
    if not isinstance(example, StoredExample):
        hint = " (open the store first: aa.open_store(path)[index])" if isinstance(example, (str, Path)) else ""
        raise OptionError(f"example must be a scored example (score(...)[i] or open_store(path)[i]),"
                          f" got {type(example).__name__}{hint}")
    if getattr(example, "family", "self") == "cross":
        raise OptionError("the attribution tree links tokens of one sequence; the cross family (decoder queries,"
                          " encoder keys) has none: give family encoder or decoder")
    if getattr(example, "nonfinite", None):
        raise StoreError(f"example {example.index} holds NaN or inf in its {', '.join(example.nonfinite)}"
                         " (flagged 'nonfinite' in the store): it has no tree")
    if example.attribution is None:
        if example.head_sum is None:
            raise OptionError(f"example {example.index} keeps no attribution maps or head sums (scored with keep none):"
                              " score it again with keep sum or keep maps")
        import copy

        example = copy.copy(example)
        example.attribution = example.head_sum
    g = tree_for_example(example, layers=layers, tau=DEFAULT_TAU if tau is None else tau, lam=lam, compat=compat,
                         num_layers=num_layers, top=root)
    from ..views import prediction_line

    return Tree(g, title=f"{title or f'example {example.index}'}: top node {node_label(g, g.graph['top'])}",
                prediction=prediction_line(example, getattr(example, "label_names", None)))
