"""Circuits: ``circuit``, which heads carry a behaviour, judged by MIB's faithfulness curve
(pairs from ``make_pairs`` / ``pair_data`` in api/demo.py, or a JSONL file)."""

from __future__ import annotations

import contextlib
import functools
import os
from dataclasses import dataclass, field

import numpy as np

from ..errors import OptionError
from .checks import File, Instance, Int, Names, OneOf, Out, Progress, Seed, Str, Threads, checked
from .model import ModelArg, progress_for, using
from .tables import Table, saved

SUMMARY_COLUMNS = ["method", "cpr", "cpr_low", "cpr_high", "cmd", "cmd_low", "cmd_high", "spearman_patching",
                   "top10_shared", "cpu_s_per_pair", "completeness"]
CURVE_COLUMNS = ["method", "ranking", "k", "heads_kept", "f"]


@dataclass
class Circuit(Table):
    """Head rankings and their faithfulness curves.

    ``methods`` maps a method name to its result: ``scores`` [layer, head] (mean over pairs,
    in units of the metric), ``curve`` (f at each k, heads ranked by signed score: CPR's),
    ``curve_abs`` (by absolute score: CMD's), ``cpr``, ``cmd`` and their bootstrap intervals,
    ``spearman`` with exact patching (when ``patching`` was computed), ``cpu_s_per_pair``.
    ``recommended`` is the method docs/circuits.md recommends."""

    methods: dict
    recommended: str
    clean: float  # m(N): the metric of the clean model, mean over pairs
    empty: float  # m(empty): every head ablated
    n_pairs: int
    ablation: str
    metric: str
    layers: int
    heads: int
    model: str = ""
    percentages: tuple = ()
    nodes: str = "heads"  # heads+mlp: column ``heads`` of every [layer, node] array is the layer's MLP
    path: str | None = None
    extra: dict = field(default_factory=dict)
    data: str | None = None  # the pairs file it was made from: save, plot and heatmap never write over it
    # MIB's protocol: {"kind", "seed", "fit": pair indices the methods saw, "eval": the pairs the curve
    # (n_pairs of them) is measured on, "same_pairs"}; empty for a result made before the split existed
    split: dict = field(default_factory=dict)

    @property
    def width(self) -> int:
        """Nodes per layer: the heads, and the MLP with ``nodes="heads+mlp"``."""
        return self.heads + (1 if self.nodes == "heads+mlp" else 0)

    # ------------------------------------------------------------- tables
    def _rows(self) -> list[dict]:
        rows = []
        for name, r in self.methods.items():
            rows.append({"method": name, "cpr": r.cpr, "cpr_low": r.cpr_interval[0], "cpr_high": r.cpr_interval[1],
                         "cmd": r.cmd, "cmd_low": r.cmd_interval[0], "cmd_high": r.cmd_interval[1],
                         "spearman_patching": r.spearman, "top10_shared": r.top10_shared,
                         "cpu_s_per_pair": r.cpu_s_per_pair, "completeness": r.completeness})
        return rows

    @checked(what=Str(choices=("summary", "curves", "scores")))
    def to_pandas(self, what: str = "summary"):
        """``summary`` (default): one row per method (``cpr``, ``cmd`` with 95 % bootstrap
        intervals, ``spearman_patching``, ``top10_shared``, ``cpu_s_per_pair``,
        ``completeness``); ``curves``: one row per method, ranking (signed, absolute) and k;
        ``scores``: one row per method, layer and node (``head``; with MLP nodes, ``head`` ==
        ``heads`` and ``node`` "mlp" is the layer's MLP)."""
        from ..views.notebook import data_frame

        if what == "summary":
            return data_frame(self._rows(), SUMMARY_COLUMNS)
        if what == "curves":
            n = self.layers * self.width
            rows = [{"method": name, "ranking": ranking, "k": k, "heads_kept": int(k * n), "f": f}
                    for name, r in self.methods.items()
                    for ranking, curve in (("signed", r.curve), ("absolute", r.curve_abs))
                    for k, f in zip(self.percentages, curve)]
            return data_frame(rows, CURVE_COLUMNS)
        rows = [{"method": name, "layer": l, "head": h, "node": "mlp" if h == self.heads else "head",
                 "score": float(r.scores[l, h])}
                for name, r in self.methods.items() for l in range(self.layers) for h in range(self.width)]
        return data_frame(rows, ["method", "layer", "head", "node", "score"])  # "scores" (@checked refuses the rest)

    @checked()
    def ranking(self, method: str | None = None) -> list[tuple[int, int]]:
        """(layer, head) from the most to the least important by ``method`` (default: the recommended);
        with MLP nodes, head ``heads`` is the layer's MLP."""
        s = self._method(method).scores
        return [tuple(int(x) for x in np.unravel_index(i, s.shape)) for i in np.argsort(-s.ravel(), kind="stable")]

    def _method(self, method):
        name = self.recommended if method is None else method
        if name not in self.methods:
            raise OptionError(f"no method {name!r} in this result; there are: {', '.join(self.methods)}")
        return self.methods[name]

    # ------------------------------------------------------------- pictures
    @checked(path=Out())
    def plot(self, path=None, absolute: bool = False):
        """The faithfulness curves, one line per method (f against the share of heads kept; the
        signed ranking, or with ``absolute`` the ranking by |score|): a matplotlib Figure, also
        written to ``path`` (.png, .svg, .pdf) when given."""
        from ..analysis.circuits.plots import curves_figure

        self._not_onto_data(path)
        return saved(curves_figure(self, absolute=absolute), path)

    @checked(path=Out())
    def heatmap(self, method: str | None = None, path=None):
        """A layer x head heatmap of ``method``'s scores (default: the recommended method)."""
        from ..analysis.circuits.plots import heatmap_figure

        self._not_onto_data(path)
        return saved(heatmap_figure(self, self._method(method).name), path)

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        rows = []
        for r in self._rows():
            rows.append([r["method"] + (" (recommended)" if r["method"] == self.recommended else ""),
                         f"{r['cpr']:.3f} [{r['cpr_low']:.3f}, {r['cpr_high']:.3f}]",
                         f"{r['cmd']:.3f} [{r['cmd_low']:.3f}, {r['cmd_high']:.3f}]",
                         "" if r["spearman_patching"] is None else f"{r['spearman_patching']:.3f}",
                         f"{r['cpu_s_per_pair']:.2f}"])
        return table_html(rows, ["method", "CPR (higher better)", "CMD (lower better)", "Spearman with patching",
                                 "CPU s per pair"], title=repr(self))

    def __repr__(self) -> str:
        best = self.methods[self.recommended]
        mlp = " + MLP" if self.width > self.heads else ""
        return (f"Circuit({self.n_pairs} pairs, {self.layers} layers x {self.heads} heads{mlp}, metric {self.metric}, "
                f"ablation {self.ablation}{self.describe_split()}: m(N) {self.clean:.4g}, m(empty) {self.empty:.4g}; methods "
                f"{', '.join(self.methods)}; {self.recommended}: CPR {best.cpr:.3f}, CMD {best.cmd:.3f})")

    def describe_split(self) -> str:
        """The split in words, as the table's note and the repr say it ("" for an older result)."""
        sp = self.split
        if not sp:
            return ""
        if sp.get("same_pairs"):
            return ", no split (methods and curve on the same pairs)"
        return f", split {sp['kind']} seed {sp['seed']}: methods on {len(sp['fit'])} pairs, curve on {len(sp['eval'])}"

    def _not_onto_data(self, path) -> None:
        from ..fileio import check_output

        check_output(path, [self.data], "path")

    # ------------------------------------------------------------- files
    def to_dict(self) -> dict:
        """The JSON of ``attattr circuit --json``."""
        return {
            "model": self.model, "pairs": self.n_pairs, "metric": self.metric, "ablation": self.ablation,
            "layers": self.layers, "heads": self.heads, "nodes": self.nodes, "m_clean": self.clean,
            "m_empty": self.empty, "split": self.split,
            "percentages": list(self.percentages),
            "methods": {name: {"cpr": r.cpr, "cmd": r.cmd, "cpr_interval": list(r.cpr_interval),
                               "cmd_interval": list(r.cmd_interval), "curve": list(r.curve),
                               "curve_abs": list(r.curve_abs), "spearman_patching": r.spearman,
                               "top10_shared": r.top10_shared, "completeness": r.completeness,
                               "scores": [[l, h, float(r.scores[l, h])] for l in range(self.layers)
                                          for h in range(self.width)],
                               "cpu_s_per_prompt": r.cpu_s_per_pair}
                        for name, r in self.methods.items()},
            "recommended": self.recommended,
        }

    @checked(path=Out())
    def save(self, path) -> str:
        """Write the result as an HDF5 file (schema ``attattr.circuit``; docs/circuits.md). Refused
        before writing: a path that is the pairs file the result was made from, a device or a
        folder, or one that cannot be written; one process at a time writes a path."""
        from ..analysis.circuits.io import write
        from ..fileio import check_file_output, one_writer

        check_file_output(path, [self.data], "path")
        with one_writer(path, "path"):
            write(path, self)
        self.path = os.fspath(path)
        return self.path


def _pairs_of(pairs):
    """The pairs, read (a file with bounds) and checked: a counterfactual that is its prompt is refused."""
    from ..data.pairs import Pair, pair_from_dict, read_pairs

    if isinstance(pairs, (str, os.PathLike)):
        return read_pairs(pairs, distinct=True)
    out = []
    for i, p in enumerate(pairs):
        if isinstance(p, Pair):
            pair_from_dict(p.to_json(), i, f"pairs[{i}]", distinct=True)  # the same checks
            out.append(p)
        else:
            out.append(pair_from_dict(p, i, f"pairs[{i}]", distinct=True))
    if not out:
        raise OptionError("pairs is empty")
    return out


PairsArg = OneOf(File(), Instance(list, tuple, what="a list"), what="a JSONL path or a list of pairs")
BOOTSTRAP_MAX = 100_000  # resamples: more only costs time (the interval's ends move by noise)


def _outputs_held(fn):
    """Around ``circuit``: its outputs checked before any work, then held by this run alone until
    written (fileio.one_writer; docs/api.md, "Circuits")."""

    @functools.wraps(fn)
    def call(model, pairs, *args, out=None, json=None, plot=None, **kw):
        from ..fileio import check_file_output, check_output, check_writable, one_writer

        inputs = [x for x in (pairs, model) if isinstance(x, (str, os.PathLike))]
        check_file_output(out, inputs, "out")
        check_output(json, [*inputs, out], "json")
        check_output(plot, [*inputs, out, json], "plot")
        named = [(n, os.path.abspath(p)) for n, p in (("out", out), ("json", json), ("plot", plot)) if p is not None]
        for i, (n, p) in enumerate(named):  # none of them there yet: two outputs onto one path
            for m, q in named[:i]:
                if p == q:
                    raise OptionError(f"{n} {p} is the same file as {m}: give each its own path")
        check_writable(json, "json")
        check_writable(plot, "plot")
        with one_writer(out, "out"), one_writer(json, "json"):
            return fn(model, pairs, *args, out=out, json=json, plot=plot, **kw)

    return call


@contextlib.contextmanager
def _threads(requested, loaded, pairs):
    """torch's CPU threads for the run: ``requested``, else as score chooses them
    (engine/threads.py) for the tokens one pass holds (the longest prompt, times the pairs a
    batch holds); torch's own count restored after."""
    from ..engine import memory, threads

    tokens = 0
    if requested is None:
        tokens = max(len(loaded.tokenizer(p.prompt)["input_ids"]) for p in pairs) * min(len(pairs), 32)
    with threads.using(threads.choose(tokens, requested, memory.hidden_size(loaded.model.config))) as count:
        yield count


@checked(model=ModelArg(), pairs=PairsArg, methods=Names(), ablation=Str(), metric=Str(), nodes=Str(),
         steps=Int(min=1), seed=Seed(), bootstrap=Int(min=10, max=BOOTSTRAP_MAX), progress=Progress(), out=Out(),
         json=Out(), threads=Threads(), split=Str(), verify=Int(min=0), plot=Out())
@_outputs_held
def circuit(model, pairs, *, methods=None, ablation: str = "patching", metric: str = "logit-diff",
            nodes: str = "heads", steps: int | None = None, seed: int = 0, bootstrap: int = 1000,
            split: str = "half", verify: int | None = None,
            device: str = "auto", progress=False, out=None, json=None, threads: int | None = None,
            plot=None) -> Circuit:
    """Rank attention heads by each of ``methods`` (a list or comma string of registered head
    methods, ``"all"``; default: atp-verified, attr-gates, atp, nap-ig) on counterfactual
    ``pairs`` (a JSONL path or a list of pairs / dicts with prompt, counterfactual, answer,
    foil), and judge each ranking by MIB's faithfulness curve with the heads outside the
    circuit ablated by ``ablation`` (patching, mean, zero). ``metric``: logit-diff (default),
    logprob-diff or prob. Returns :class:`Circuit`; ``out`` also writes it as HDF5, ``json``
    as JSON, ``plot`` draws its curves (.png, .svg, .pdf); all three checked before any work.

    ``split`` (MIB's protocol, recorded in the result): ``"half"`` (default) gives a half of the
    pairs, drawn by ``seed``, to the methods and measures the curve on the other; a fraction in
    (0, 1) sets the methods' share; ``"none"`` uses every pair for both. ``verify``: how many
    heads of largest |AtP| the verifying methods patch exactly (default 15). ``nodes="heads+mlp"``
    ranks each layer's MLP too. ``threads``: torch's CPU threads (default: as ``score`` chooses them).

    Raises OptionError, before the model loads, for a bad argument, pairs file or output (each
    output held by this run alone until written at the end; docs/api.md, "Circuits"), and once
    the two ends are measured for counterfactuals that do not change the metric."""
    from ..analysis import circuits as reg
    from ..analysis.circuits.split import split_pairs
    from ..analysis.circuits.evaluate import PERCENTAGES
    from ..analysis.circuits.run import evaluate
    from ..analysis.circuits.task import ABLATIONS, NODES, CircuitTask, Context

    if ablation not in ABLATIONS:
        raise OptionError(f"unknown ablation {ablation!r}; available: {', '.join(ABLATIONS)}")
    if nodes not in NODES:
        raise OptionError(f"unknown nodes {nodes!r}; available: {', '.join(NODES)}")
    if isinstance(methods, (list, tuple)):
        methods = ",".join(methods)
    wanted = reg.parse_methods(methods)
    if nodes == "heads+mlp":
        heads_only = [n for n in wanted if not reg.REGISTRY[n].mlp]
        if heads_only:
            able = ", ".join(n for n in reg.REGISTRY if reg.REGISTRY[n].mlp)
            raise OptionError(f"{', '.join(heads_only)} score attention heads only; with nodes heads+mlp use: {able}")
    the_pairs = _pairs_of(pairs)
    parts = split_pairs(len(the_pairs), str(split), seed)  # refused before the model loads
    with using(model, device=device, lm=True) as m, _threads(threads, m.loaded, the_pairs):
        make = lambda idx: CircuitTask(m.loaded, [the_pairs[i] for i in idx], metric=metric,  # noqa: E731
                                       mlp=nodes == "heads+mlp")
        task = make(parts.eval)
        with progress_for(progress, "circuit") as bar:
            settings = dict(ablation=ablation, steps=steps, seed=seed, progress=bar, verify=verify)
            ctx = Context(task, **settings)
            fit = ctx if parts.same else Context(make(parts.fit), **settings)
            run = evaluate(ctx, wanted, bootstrap_samples=bootstrap, fit=fit)
        name = m.loaded.model_id
    result = Circuit(run.methods, reg.RECOMMENDED, run.clean, run.empty, run.n_pairs, run.ablation, run.metric,
                     run.layers, run.heads, model=str(name), percentages=PERCENTAGES, nodes=nodes,
                     split=parts.to_dict())
    result.data = os.fspath(pairs) if isinstance(pairs, (str, os.PathLike)) else None
    if out is not None:
        result.save(out)
    if json is not None:
        from ..fileio import write_json

        write_json(json, result.to_dict())
    if plot is not None:
        result.plot(plot)
    return result
