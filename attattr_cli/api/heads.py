"""Heads: ``importance``, ``predict`` with heads masked, ``prune``."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError
from .checks import (Array, Examples, File, Inputs, Instance, Int, Ints, Names, Number, Numbers, OneOf, Out, Progress,
                     Source, Str, Texts, Threads, checked)
from .inputs import check_methods_given, check_outputs, command_of, open_source, pairs_given, selection, model_and_data
from .model import ModelArg, progress_for, using
from .tables import Table, saved
from ..engine.threads import on_threads
from ..fileio import write_json


# ----------------------------------------------------------------------------- importance

IMPORTANCE_COLUMNS = ["table", "method", "seed", "layer", "head", "value", "rank", "rank_low", "rank_high"]
PREDICTION_COLUMNS = ["position", "prediction", "prediction_id", "gold", "gold_id", "probability", "correct"]
CURVE_COLUMNS = ["analysis", "method", "rate", "heads_masked", "k", "metric", "value", "low", "high"]


def _stability_dict(st):
    if st is None:
        return None
    return {k: (np.asarray(v).tolist() if isinstance(v, np.ndarray) else v) for k, v in st.items()}


@dataclass
class Importance(Table):
    """Head importance tables: ``tables`` maps a name (attr, attention, taylor, random-0, ...) to
    a table whose ``values`` is a numpy [layer, head] array; ``identity`` the model they belong
    to; ``path`` the importance file when one was written. ``to_pandas()``: one row per table,
    layer and head (``rank`` 1 the most important in its table; for store tables
    ``rank_low``/``rank_high``, the 95 % bootstrap rank interval)."""

    COLUMNS = IMPORTANCE_COLUMNS

    identity: Any
    tables: dict
    path: str | None = None
    skipped_nonfinite: int = 0  # store examples left out because they hold NaN or inf
    unconverged: int = 0  # store examples used whose integral is not converged in some layer
    used: int = 0  # store examples the attribution tables average

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Name -> [layer, head] numpy array."""
        return {k: np.asarray(t.values) for k, t in self.tables.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.tables:
            raise OptionError(f"no table '{name}'; there are: {', '.join(self.tables)}")
        return np.asarray(self.tables[name].values)

    @checked()
    def ranking(self, name: str) -> list[tuple[int, int]]:
        """(layer, head) from the most to the least important by table ``name``."""
        v = self[name]
        order = np.argsort(-v.ravel(), kind="stable")
        return [tuple(int(x) for x in np.unravel_index(i, v.shape)) for i in order]

    @checked(path=Out())
    def plot(self, path=None, title: str | None = None):
        """One heatmap per table (attr, taylor, attention, random ...): a matplotlib ``Figure``,
        also written to ``path`` (.png, .svg, .pdf) when given."""
        from ..analysis.plots import importance_figure

        return saved(importance_figure(list(self.tables.values()),
                                       title=self.identity.model if title is None else title), path)

    def _rows(self) -> list[dict]:
        rows = []
        for name, t in self.tables.items():
            v = np.asarray(t.values, dtype=np.float64)
            order = np.argsort(-v.ravel(), kind="stable")
            rank = np.empty(v.size, dtype=int)
            rank[order] = np.arange(1, v.size + 1)
            st = getattr(t, "stability", None) or {}
            lo, hi = st.get("rank_low"), st.get("rank_high")
            for (layer, head), value in np.ndenumerate(v):
                rows.append({"table": name, "method": t.method, "seed": t.seed, "layer": layer, "head": head,
                             "value": float(value), "rank": int(rank[layer * v.shape[1] + head]),
                             "rank_low": None if lo is None else float(np.asarray(lo)[layer, head]),
                             "rank_high": None if hi is None else float(np.asarray(hi)[layer, head])})
        return rows

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        rows = [[name, t.method, " ".join(f"L{l}H{h} ({self[name][l, h]:.3g})" for l, h in self.ranking(name)[:5])]
                for name, t in self.tables.items()]
        return table_html(rows, ["table", "method", "most important heads"], title=repr(self))

    def __repr__(self) -> str:
        ident = self.identity
        names = list(self.tables)
        shown = ", ".join(names[:6]) + (f", … ({len(names)} tables)" if len(names) > 6 else "")
        return (f"Importance(model {ident.model!r}, {ident.num_layers} layers x {ident.num_heads} heads, "
                f"tables: {shown}" + (f"; {self.used} examples" if self.used else "")
                + (f", {self.unconverged} not converged" if self.unconverged else "")
                + (f"; path {self.path!r}" if self.path else "") + ")")

    def as_file(self):
        """The tables as an ``analysis.importance.ImportanceFile`` (what pruning reads)."""
        from ..analysis.importance import ImportanceFile

        return ImportanceFile(self.path or "memory", self.identity, dict(self.tables))

    def to_dict(self) -> dict:
        """JSON-able: the model's identity and every table's values."""
        return {"identity": asdict(self.identity), "path": self.path,
                "tables": {k: {"method": t.method, "values": np.asarray(t.values).tolist(), "examples": list(t.examples),
                               "seed": t.seed, "source": t.source, "description": t.description,
                               "stability": _stability_dict(getattr(t, "stability", None))}
                           for k, t in self.tables.items()}}


@checked(source=Source(), model=ModelArg(), data=File(), task=Str(), examples=Examples(), inputs=Inputs(), methods=Names(),
         seeds=Ints(), batch_size=Int(min=1), out=Out(), progress=Progress(), command=Texts(), threads=Threads())
@on_threads
def importance(source=None, *, model=None, data=None, task=None, examples=None, inputs=None, methods=None,
               seeds: Sequence[int] = (0, 1, 2, 3, 4), batch_size: int = 32, normalize: bool = True,
               truncate: bool = False, family: str | None = None, device: str = "auto", out=None,
               progress=False, command=None, metric: str | None = None, threads: int | None = None) -> Importance:
    """Rank attention heads. From a store (``source``: a path or an open store): ``attr``
    (E_x max Attr_h) and ``attention``; from a model and data: ``taylor`` (Michel et al.,
    unit L2 norm per layer unless ``normalize=False``) and ``random`` (one table per seed).
    ``methods`` a list or comma string (default attr,attention with a store, taylor,random
    without; on pairs also every head method of :func:`circuit`: docs/api.md, "importance").
    ``out``: also write (or add to) an importance file. Returns :class:`Importance`."""
    from ..analysis import importance as imp

    check_methods_given(methods)
    if isinstance(methods, (list, tuple)):
        methods = ",".join(methods)
    check_outputs({"out": out}, [source, model, data])
    tables = []
    if source is not None:
        if model is not None or data is not None or task is not None or inputs is not None:
            raise OptionError("give either a store or model/data/task, not both")
        wanted = imp.parse_methods(methods or "attr,attention", "store")
        st, close = open_source(source)
        try:
            chosen = None
            if examples is not None:
                from ..data import parse_examples

                have = st.indices()
                chosen = parse_examples(selection(examples), (max(have) + 1) if have else 0)
            with progress_for(progress, "importance") as bar:
                ident, tables = imp.from_store(st, [m for m in wanted if m in imp.STORE_METHODS], chosen, bar,
                                               family=family)
        finally:
            close()
    else:
        if family is not None:
            raise OptionError("family goes with a store; with a model, Taylor importance covers the heads attattr masks")
        on_pairs = pairs_given(data, inputs) or metric is not None
        wanted = imp.parse_methods(methods or "taylor,random", "pairs" if on_pairs else "data")
        if on_pairs:  # clean / counterfactual pairs of a language model
            ident, tables = _taylor_pairs(model, data, task, examples, inputs, wanted, batch_size, normalize, device,
                                          progress, metric)
        else:
            m, _task, picked, label_map, _rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
            with using(m) as m:
                ident = imp.identity_of(m.loaded)
                if "taylor" in wanted:
                    with progress_for(progress, "taylor") as bar:
                        t = imp.taylor(m.loaded, picked, label_map, batch_size, normalize, truncate, bar)
                    t.source = f"{data or ('memory' if inputs is not None else 'builtin')}"
                    tables.append(t)
    if "random" in wanted:
        tables.extend(imp.random_table(ident.num_layers, ident.num_heads, s) for s in list(seeds) or [0])
    counts = (max((t.skipped_nonfinite for t in tables), default=0), max((t.unconverged for t in tables), default=0),
              max((len(t.examples) for t in tables if t.method == "attr"), default=0))  # skipped, unconverged, used
    if out is None:
        return Importance(ident, {t.name: t for t in tables}, None, *counts)
    written = imp.write(out, ident, tables, command_of(command))
    return Importance(written.identity, written.tables, str(out), *counts)


# ----------------------------------------------------------------------------- predict with masked heads


@dataclass
class Predictions(Table):
    """Class predictions: ``logits`` and ``probabilities`` [example, class] (numpy),
    ``predictions`` (class names), ``gold`` (model class indices, -1 unknown), ``accuracy``
    (over examples with a gold label, None without)."""

    COLUMNS = PREDICTION_COLUMNS

    logits: np.ndarray
    probabilities: np.ndarray
    predictions: list[str]
    gold: np.ndarray
    label_names: list[str]

    @property
    def accuracy(self) -> float | None:
        """Fraction right among the examples with a gold label."""
        known = self.gold >= 0
        if not known.any():
            return None
        return float((self.logits.argmax(-1)[known] == self.gold[known]).mean())

    def _rows(self) -> list[dict]:
        ids = self.logits.argmax(-1)
        rows = []
        for i, (p, g) in enumerate(zip(ids, self.gold)):
            g = int(g)
            row = {"position": i, "prediction": self.predictions[i], "prediction_id": int(p),
                   "gold": (self.label_names[g] if g < len(self.label_names) else str(g)) if g >= 0 else None,
                   "gold_id": g, "probability": float(self.probabilities[i, int(p)]),
                   "correct": None if g < 0 else bool(int(p) == g)}
            row.update({f"p_{name}": float(self.probabilities[i, k]) for k, name in enumerate(self.label_names)})
            rows.append(row)
        return rows

    def to_pandas(self):
        """A pandas DataFrame, one row per example in input order: ``position``, ``prediction``,
        ``prediction_id``, ``gold``, ``gold_id`` (-1 unknown), ``probability`` (of the
        prediction), ``correct`` and ``p_<class>`` per class."""
        from ..views.notebook import data_frame

        return data_frame(self._rows(), PREDICTION_COLUMNS + [f"p_{n}" for n in self.label_names])

    def __repr__(self) -> str:
        acc = self.accuracy
        shown = self.predictions[:5]
        return (f"Predictions({len(self.predictions)} examples"
                + (f", accuracy {acc:.3f}" if acc is not None else "")
                + f", predictions {shown}{' …' if len(self.predictions) > 5 else ''})")


@checked(model=ModelArg(), inputs=Inputs(), data=File(), task=Str(), examples=Examples(), mask=Array(), batch_size=Int(min=1))
def predict(model=None, inputs=None, *, data=None, task=None, examples=None, mask=None, batch_size: int = 64,
            truncate: bool = False, device: str = "auto") -> Predictions:
    """Classify ``inputs`` (or data/task rows), optionally with attention heads masked: ``mask``
    a [layer, head] array of 0 (head off) and 1 (on), or scales in between. Returns
    :class:`Predictions`."""
    import torch

    from ..engine.heads import Batches, logits_under

    m, _task, picked, label_map, _rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
    with using(m) as m:
        scale = None
        if mask is not None:
            scale = torch.as_tensor(np.asarray(mask, np.float32))
            want = (m.num_layers, m.num_heads)
            if tuple(scale.shape) != want:
                raise OptionError(f"mask must have shape {want} (layers, heads), got {tuple(scale.shape)}")
        batches = Batches(m.loaded, picked, label_map, batch_size, truncate)
        logits = logits_under(m.loaded, batches, scale).float()
        gold = batches.gold().numpy()
        probs = torch.softmax(logits, -1).numpy()
        names = m.label_names
    return Predictions(logits.numpy(), probs, [names[int(i)] for i in logits.argmax(-1)], gold, names)


# ----------------------------------------------------------------------------- prune


@dataclass
class PruneResult(Table):
    """What pruning measured: ``curves`` (per method the metric at each rate, against the
    unpruned ``baseline``), ``effectiveness`` (the per-example analysis), ``pruned_model``
    (a saved model with heads removed), each None when not asked for; ``info`` the rest
    of the CURVES.json document. ``to_pandas()``: one row per point of a curve (``method``
    ``unpruned`` the baseline; ``k`` heads per layer, effectiveness; bootstrap ``low``/``high``)."""

    COLUMNS = CURVE_COLUMNS

    curves: dict | None = None
    effectiveness: dict | None = None
    pruned_model: dict | None = None
    info: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        """The CURVES.json document."""
        d = dict(self.info)
        for k in ("curves", "effectiveness", "pruned_model"):
            if getattr(self, k) is not None:
                d[k] = getattr(self, k)
        return d

    @checked(path=Out())
    def plot(self, path=None):
        """The curves and/or the effectiveness analysis side by side: a matplotlib ``Figure``,
        also written to ``path`` (.png, .svg, .pdf) when given."""
        from ..analysis.plots import prune_plot

        d = self.to_dict()
        return saved(prune_plot(d, title=f"{d.get('model')} on "
                                         f"{d['task'] if d.get('task') not in (None, 'generic') else 'data'}"), path)

    def _rows(self) -> list[dict]:
        rows = []
        if self.curves:
            c = self.curves
            metric = c.get("metric", "accuracy")
            rows.append({"analysis": "curves", "method": "unpruned", "rate": 0.0, "heads_masked": 0, "k": None,
                         "metric": metric, "value": c["baseline"][metric], "low": None, "high": None})
            for name, entry in c["methods"].items():
                for j, rate in enumerate(c["rates"]):
                    lo, hi, hm = entry.get(f"{metric}_low"), entry.get(f"{metric}_high"), entry.get("heads_masked")
                    rows.append({"analysis": "curves", "method": name, "rate": float(rate),
                                 "heads_masked": None if hm is None else int(hm[j]), "k": None, "metric": metric,
                                 "value": entry[metric][j], "low": None if not lo else lo[j],
                                 "high": None if not hi else hi[j]})
        if self.effectiveness:
            eff = self.effectiveness
            for name, entry in eff["orders"].items():
                for j, k in enumerate(eff["ks"]):
                    lo, hi = entry.get("accuracy_low"), entry.get("accuracy_high")
                    rows.append({"analysis": "effectiveness", "method": name, "rate": None, "heads_masked": None,
                                 "k": int(k), "metric": "accuracy", "value": entry["accuracy"][j],
                                 "low": None if not lo else lo[j], "high": None if not hi else hi[j]})
        return rows

    def _repr_html_(self) -> str:
        from ..views.notebook import table_html

        html = ""
        if self.curves:
            c = self.curves
            metric = c.get("metric", "accuracy")
            names = list(c["methods"])
            rows = [[f"{r:.0%}"] + [c["methods"][n][metric][j] for n in names] for j, r in enumerate(c["rates"])]
            html += table_html(rows, ["pruned"] + names, title=f"{metric} with the least important heads pruned"
                               f" (unpruned {c['baseline'][metric]:.3g})")
        if self.effectiveness:
            eff = self.effectiveness
            names = list(eff["orders"])
            rows = [[k] + [eff["orders"][n]["accuracy"][j] for n in names] for j, k in enumerate(eff["ks"])]
            html += table_html(rows, ["k per layer"] + names, title="effectiveness")
        return html or f"<pre>{repr(self)}</pre>"

    def __repr__(self) -> str:
        parts = [f"model {self.info.get('model')!r}"]
        if self.curves:
            c = self.curves
            metric = c.get("metric", "accuracy")
            last = {n: round(float(e[metric][-1]), 4) for n, e in c["methods"].items()}
            parts.append(f"curves at {len(c['rates'])} rates ({c['n_examples']} examples), unpruned {metric}"
                         f" {c['baseline'][metric]:.4g}, at {c['rates'][-1]:.0%}: {last}")
        if self.effectiveness:
            parts.append(f"effectiveness k={self.effectiveness['ks']}")
        if self.pruned_model:
            parts.append("a pruned model saved")
        return "PruneResult(" + "; ".join(parts) + ")"


@checked(model=ModelArg(), importance=OneOf(File(), Instance(Importance, what="an Importance")), data=File(), task=Str(),
         examples=Examples(), inputs=Inputs(), rates=OneOf(Str(), Numbers(), what="'start:stop:step', a comma text or a list of numbers"),
         methods=Names(), batch_size=Int(min=1), keep_heads=Number(0, 1), save_model=Out(folder=True),
         effectiveness=File(), ks=Ints(min=1, text=True), out=Out(), progress=Progress(), command=Texts(),
         threads=Threads(), split=Str(choices=("held-out", "none")))
@on_threads
def prune(model=None, importance=None, *, data=None, task=None, examples=None, inputs=None, rates="0:1:0.1",
          methods=None, batch_size: int = 64, keep_heads: float | None = None, save_model=None,
          keep_method: str | None = None, effectiveness=None, ks=None, device: str = "auto",
          truncate: bool = False, out=None, progress=False, command=None, metric: str | None = None,
          threads: int | None = None, split: str = "held-out") -> PruneResult:
    """Mask the least important heads at each rate (a fraction of all heads) and evaluate, for
    every table of ``importance`` (an :class:`Importance`, or an importance file's path);
    ``rates`` "start:stop:step", a comma string or a list. ``effectiveness``: a store of the
    model on the data: the paper's per-example analysis (``ks`` heads per layer). ``keep_heads``
    with ``save_model``: save a model with only that fraction of heads. ``out``: write the
    JSON document. Returns :class:`PruneResult`. On clean / counterfactual pairs of a causal
    language model the curves are the mean ``metric`` of the pairs, measured with ``split``
    ("held-out" or "none") on the pairs no table was averaged over (docs/api.md, "prune")."""
    from ..analysis import importance as imp
    from ..analysis import prune as pr
    from ..engine.heads import Batches

    check_methods_given(methods)
    if importance is None and effectiveness is None:
        raise OptionError("nothing to do: give importance (curves) and/or effectiveness (a store)")
    if (keep_heads is None) != (save_model is None):
        raise OptionError("keep_heads and save_model go together")
    if keep_heads is not None and importance is None:
        raise OptionError("keep_heads needs importance to rank the heads")
    check_outputs({"out": out, "save_model": save_model}, [model, data, effectiveness,
                                                             None if isinstance(importance, Importance) else importance])
    rate_list = pr.parse_rates(rates if isinstance(rates, str) else ",".join(str(float(r)) for r in rates))
    if isinstance(importance, Importance):
        imp_file = importance.as_file()
    else:
        imp_file = None if importance is None else imp.read(importance)
    if isinstance(methods, str):
        methods = [x.strip() for x in methods.split(",") if x.strip()]
    if pairs_given(data, inputs) or metric is not None:
        return _prune_pairs(model, imp_file, data, task, examples, inputs, rate_list, methods, batch_size, keep_heads,
                            effectiveness, device, out, progress, command, metric, split)
    m, task_obj, picked, label_map, rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
    with using(m) as m:
        loaded = m.loaded
        if imp_file is not None:
            imp.check_model(imp_file, loaded)
        task_name = task_obj.name if task_obj else None
        res = PruneResult(info={
            **_identity(imp.identity_of(loaded)), "task": task_name or "generic",
            "data": data or ("memory" if inputs is not None else "builtin"), "examples": selection(examples) or "all",
            "importance": (imp_file.path if imp_file is not None else None), "command": command_of(command),
        })
        batches = Batches(loaded, picked, label_map, batch_size, truncate)
        if imp_file is not None:
            with progress_for(progress, "prune") as bar:
                res.curves = pr.curves(loaded, batches, imp_file, rate_list, task_name, methods, bar)
        if effectiveness is not None:
            with progress_for(progress, "effectiveness") as bar:
                res.effectiveness = pr.effectiveness_from_store(loaded, effectiveness, rows, picked, label_map, ks,
                                                                batch_size, truncate, task_name, bar)
        if save_model is not None:
            res.pruned_model = pr.save_and_compare(loaded, imp_file, keep_heads, keep_method, save_model, batches)
    if out is not None:
        write_json(out, res.to_dict(), make_parents=True)
    return res


def _prune_pairs(model, imp_file, data, task, examples, inputs, rates, methods, batch_size, keep_heads, effectiveness,
                 device, out, progress, command, metric, split: str = "held-out") -> PruneResult:
    """:func:`prune` on clean / counterfactual pairs of a causal language model: the curves of the
    mean pair metric with the pruned heads zeroed (analysis/prune.py ``pair_curves``)."""
    from ..analysis import importance as imp
    from ..analysis import prune as pr
    from .model import as_model

    if effectiveness is not None or keep_heads is not None:
        raise OptionError("effectiveness and keep_heads/save_model go with classifiers; pairs get the curves")
    if imp_file is None:
        raise OptionError("pairs need importance (the curves)")
    metric, picked = _pair_rows(data, inputs, examples, task, model, metric,
                                "the causal language model the importance file ranks")
    seen = sorted({int(i) for t in imp_file.tables.values() for i in t.examples})
    if split == "held-out":  # MIB's protocol: the curves never on pairs a ranking was made from
        picked = [r for r in picked if r.index not in set(seen)]
        if not picked:
            raise OptionError(f"every picked pair was used by the importance tables ({len(seen)} pairs): give pairs "
                              "they did not see (--examples), or split none for the same-pairs curves")
    with using(as_model(model, device=device, lm=True)) as m:
        loaded = m.loaded
        if not getattr(loaded, "lm", False):
            raise OptionError("pairs are scored by a causal language model: load it with lm=True")
        imp.check_model(imp_file, loaded)
        res = PruneResult(info={
            **_identity(imp.identity_of(loaded)), "task": "pairs", "data": data or "memory",
            "examples": selection(examples) or "all", "importance": imp_file.path, "command": command_of(command),
            "metric": metric,
            "split": {"kind": split, "same_pairs": split == "none", "eval": [int(r.index) for r in picked],
                      "ranked_on": seen},
        })
        batches = pr.PairBatches(loaded, picked, metric, batch_size)
        with progress_for(progress, "prune") as bar:
            res.curves = pr.pair_curves(loaded, batches, imp_file, rates, methods, bar)
    if out is not None:
        write_json(out, res.to_dict(), make_parents=True)
    return res


def _identity(ident) -> dict:
    return {"model": ident.model, "weights_sha256": ident.weights_sha256, "model_type": ident.model_type}


def _pair_rows(data, inputs, examples, task, model, metric, model_needed: str):
    """(the metric, default logit-diff; the picked examples) of clean / counterfactual pairs (a
    pairs JSONL or Pair inputs), refused before any work: an unknown metric, a task preset, no
    model (``model_needed`` says which), both data and inputs, no pairs."""
    from ..data import parse_examples
    from ..data.pairs import as_examples, read_pairs
    from ..engine.options import METRICS
    from .inputs import to_examples

    metric = "logit-diff" if metric is None else metric
    if metric not in METRICS:
        raise OptionError(f"unknown metric '{metric}'; available: {', '.join(METRICS)}")
    if task is not None:
        raise OptionError("task presets are classification tasks; pairs are their own task")
    if model is None:
        raise OptionError(f"pairs need a model: {model_needed}")
    if data is not None and inputs is not None:
        raise OptionError("give inputs or data, not both")
    if not pairs_given(data, inputs):
        raise OptionError("metric goes with clean / counterfactual pairs (a JSONL of prompt, counterfactual, answer,"
                          " foil; or Pair inputs)")
    rows = as_examples(read_pairs(data)) if data is not None else to_examples(inputs)
    return metric, [rows[i] for i in parse_examples(selection(examples), len(rows))]


def _taylor_pairs(model, data, task, examples, inputs, wanted, batch_size, normalize, device, progress, metric):
    """(the model's identity, the tables of :func:`importance` on pairs: taylor when wanted, the head methods)."""
    from ..analysis import importance as imp
    from ..analysis import prune as pr
    from .model import as_model

    metric, picked = _pair_rows(data, inputs, examples, task, model, metric, "a causal language model")
    tables = []
    heads = [n for n in wanted if n in imp.pair_methods()]  # attattr circuit's head methods
    with using(as_model(model, device=device, lm=True)) as m:
        ident = imp.identity_of(m.loaded)
        if "taylor" in wanted:
            with progress_for(progress, "taylor") as bar:
                t = imp.taylor_pairs(m.loaded, pr.PairBatches(m.loaded, picked, metric, batch_size), normalize, bar)
            t.source = str(data or "memory")
            t.examples = [e.index for e in picked]
            tables.append(t)
        if heads:
            from ..data.pairs import pair_of_example

            with progress_for(progress, "importance") as bar:
                tables.extend(imp.circuit_tables(m.loaded, [pair_of_example(e) for e in picked], heads, metric,
                                                 source=str(data or "memory"), progress=bar))
    return ident, tables
