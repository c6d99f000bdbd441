"""One function per command: score, importance, prune, predict, triggers, attack, faithfulness,
finetune, merge, import_2021. They take in-memory objects as well as paths, return plain
result objects, never print and never change the caller's model."""

from __future__ import annotations

import json
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import OptionError, StoreError
from .model import Model, as_model, progress_for, using
from .results import Attribution, Results, StoreView, read_all

API_COMMAND = ["python", "attattr_cli.api"]


# ----------------------------------------------------------------------------- inputs


def to_examples(inputs) -> list:
    """Texts, (first, second) pairs, dicts with text_a/text_b/label, or ``Example`` objects, as
    a list of ``Example`` (indices 0, 1, ... unless the examples carry their own)."""
    from ..data.types import Example

    if isinstance(inputs, (str, Example)) or (isinstance(inputs, tuple) and len(inputs) == 2
                                              and all(isinstance(x, str) for x in inputs)):
        inputs = [inputs]
    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, Example):
            out.append(x)
        elif isinstance(x, str):
            out.append(Example(i, x))
        elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x):
            out.append(Example(i, x[0], x[1]))
        elif isinstance(x, dict) and "text_a" in x:
            out.append(Example(int(x.get("index", i)), x["text_a"], x.get("text_b"), x.get("label")))
        else:
            raise OptionError(f"inputs[{i}] must be a text, a (text, text) pair or an Example, not {type(x).__name__}")
    if not out:
        raise OptionError("inputs is empty")
    if len({e.index for e in out}) != len(out):
        raise OptionError("inputs have repeated indices")
    return out


def _model_arg(model) -> tuple[str | None, list[str] | None]:
    """(model id for resolving data, label names when already loaded) of a model argument."""
    if model is None or isinstance(model, (str, Path)):
        return (None if model is None else str(model)), None
    m = as_model(model)
    return (m.path or "memory"), (None if m.loaded.lm else m.label_names)


def _default_task(model_id: str | None, data, task, inputs):
    """With no inputs, data or task: the synthetic task for the built-in model; else an error."""
    if inputs is not None or data is not None or task is not None or model_id is None:
        return task
    from ..models.default import DEFAULT_MODEL_DIR

    if model_id != "memory" and Path(model_id).exists() and Path(model_id).resolve() == DEFAULT_MODEL_DIR.resolve():
        return "synthetic"
    raise OptionError("give inputs (texts or pairs), data or task for this model")


def model_and_data(model=None, data=None, task=None, examples=None, inputs=None, *, device: str = "auto",
                   dtype: str = "float32"):
    """The one place models and data are resolved the way ``score`` does: returns
    (Model, task or None, picked examples, label map, all examples, task label names)."""
    from ..data import get_task, parse_examples
    from ..engine.run import resolve_inputs
    from ..models.loading import align_labels

    if model is not None and not isinstance(model, (str, Path)):
        model = as_model(model)  # once: wrapping a (model, tokenizer) pair hashes its weights
    model_id, names = _model_arg(model)
    task = _default_task(model_id, data, task, inputs)
    if inputs is not None:
        if data is not None:
            raise OptionError("give inputs or data, not both")
        rows = to_examples(inputs)
        task_obj = get_task(task) if task is not None else None
        labels = list(task_obj.labels) if task_obj is not None else None
    else:
        resolved, task_obj, rows, labels = resolve_inputs(model_id, data, task, names)
        if model is None:
            model = resolved
    picked = [rows[i] for i in parse_examples(examples, len(rows))]
    m = as_model(model, device=device, dtype=dtype)
    label_map, _ = align_labels(labels, m.loaded)
    return m, task_obj, picked, label_map, rows, labels


def _cmd(command) -> list[str]:
    return list(command) if command else list(API_COMMAND)


def _spec(examples) -> str | None:
    if examples is None or isinstance(examples, str):
        return examples
    return ",".join(str(int(i)) for i in examples)


def _check_min(name: str, value, least: int = 1) -> None:
    if value is not None and value < least:
        raise OptionError(f"{name} must be at least {least}, got {value}")


def _write_json(path, doc: dict) -> None:
    from ..fileio import write_json

    write_json(Path(path), doc, make_parents=True)


# ----------------------------------------------------------------------------- score


def score(model=None, inputs=None, *, data=None, task=None, examples=None, out=None, steps: int = 20,
          rule: str = "right", target: str = "predicted", output: str = "prob", layers=None,
          steps_per_pass: int | None = None, family=None, keep: str = "auto", top_k: int | None = None,
          dtype: str = "float32", kernel: str = "auto", device: str = "auto", store_dtype: str = "float32",
          truncate: bool = False, seed: int = 0, lm: bool | None = None, target_token: str | None = None,
          continuation: str | None = None, position: int | None = None, progress=False, command=None, warn=None):
    """Attention attribution of every layer and head.

    ``inputs``: texts, (premise, hypothesis) pairs or ``Example`` objects; or ``data`` (a TSV,
    CSV or JSONL file) and/or ``task`` (a preset such as ``sst2``), with ``examples`` ("0:100",
    or a list of indices); with none of them the built-in synthetic held-out set. Without
    ``out`` returns :class:`Results` (one :class:`Attribution` per example, in order); with
    ``out`` writes (or resumes) the HDF5 store and returns the run's ``ScoreReport``
    (``.out``, ``.scored``, ``.skipped``, ``.mean_abs_residual``, ``.accuracy``).

    ``output`` is prob, logit or logprob; ``keep`` auto, maps, sum or none; ``top_k`` also keeps
    each head's k strongest entries; ``steps_per_pass`` bounds the steps run at once (the
    numbers do not depend on it). A causal language model (``load_model(..., lm=True)``)
    attributes the next token (``target_token``) or a ``continuation``.
    """
    from ..engine.run import ScoreRequest, score_to_store
    from ..engine.score import KEEPS, OUTPUTS, ScoreOptions

    _check_min("steps", steps)
    _check_min("steps_per_pass", steps_per_pass)
    _check_min("top_k", top_k)
    if keep not in KEEPS:
        raise OptionError(f"unknown keep '{keep}'; available: {', '.join(KEEPS)}")
    if output not in OUTPUTS:
        raise OptionError(f"unknown output '{output}'; available: {', '.join(OUTPUTS)}")
    if isinstance(family, str):
        family = [f.strip() for f in family.split(",") if f.strip()]
    if isinstance(layers, int):
        layers = [layers]
    if model is not None and not isinstance(model, (str, Path)):
        model = as_model(model, lm=bool(lm))  # once: wrapping a (model, tokenizer) pair hashes its weights
    is_lm = bool(lm) or (isinstance(model, Model) and model.loaded.lm)
    exs = to_examples(inputs) if inputs is not None else None
    model_id, names = _model_arg(model)
    if not is_lm:
        task = _default_task(model_id, data, task, exs)
    options = ScoreOptions(steps=steps, rule=rule, target=target, output=output,
                           layers=None if layers is None else list(layers), dtype=dtype, truncate=truncate,
                           step_batch=steps_per_pass, kernel=kernel, family=family, keep=keep, top_k=top_k,
                           lm=is_lm, target_token=target_token, continuation=continuation, position=position)
    tmp = None
    path = out
    if out is None:
        tmp = tempfile.TemporaryDirectory(prefix="attattr-score-")
        path = Path(tmp.name) / "scores.h5"
    try:
        with using(model, device=device, dtype=dtype, lm=is_lm) as m, progress_for(progress, "score") as bar:
            req = ScoreRequest(out=str(path), model=model_id, data=data, task=task, examples=_spec(examples),
                               options=options, device=device, store_dtype=store_dtype, seed=seed,
                               command=_cmd(command), inputs=exs, label_names=names)
            report = score_to_store(req, progress=bar, loaded=m.loaded, warn=warn)
            if out is not None:
                return report
            return read_all(path, m.label_names)
    finally:
        if tmp is not None:
            tmp.cleanup()


# ----------------------------------------------------------------------------- importance


@dataclass
class Importance:
    """Head importance tables: ``tables`` maps a name (attr, attention, taylor, random-0, ...) to
    a table whose ``values`` is a numpy [layer, head] array; ``identity`` the model they belong
    to; ``path`` the importance file when one was written."""

    identity: Any
    tables: dict
    path: str | None = None

    @property
    def values(self) -> dict[str, np.ndarray]:
        """Name -> [layer, head] numpy array."""
        return {k: np.asarray(t.values) for k, t in self.tables.items()}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self.tables:
            raise OptionError(f"no table '{name}'; there are: {', '.join(self.tables)}")
        return np.asarray(self.tables[name].values)

    def ranking(self, name: str) -> list[tuple[int, int]]:
        """(layer, head) from the most to the least important by table ``name``."""
        v = self[name]
        order = np.argsort(-v.ravel(), kind="stable")
        return [tuple(int(x) for x in np.unravel_index(i, v.shape)) for i in order]

    def as_file(self):
        """The tables as an ``analysis.importance.ImportanceFile`` (what pruning reads)."""
        from ..analysis.importance import ImportanceFile

        return ImportanceFile(self.path or "memory", self.identity, dict(self.tables))

    def to_dict(self) -> dict:
        """JSON-able: the model's identity and every table's values."""
        return {"identity": asdict(self.identity), "path": self.path,
                "tables": {k: {"method": t.method, "values": np.asarray(t.values).tolist(), "examples": list(t.examples),
                               "seed": t.seed, "source": t.source, "description": t.description}
                           for k, t in self.tables.items()}}

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def importance(source=None, *, model=None, data=None, task=None, examples=None, inputs=None, methods=None,
               seeds: Sequence[int] = (0, 1, 2), batch_size: int = 32, normalize: bool = True,
               truncate: bool = False, family: str | None = None, device: str = "auto", out=None,
               progress=False, command=None) -> Importance:
    """Rank attention heads. From a store (``source``: a path or an open store): ``attr``
    (E_x max Attr_h) and ``attention``; from a model and data: ``taylor`` (Michel et al.,
    unit L2 norm per layer unless ``normalize=False``) and ``random`` (one table per seed).
    ``methods`` a list or comma string (default attr,attention with a store, taylor,random
    without). ``out``: also write (or add to) an importance file. Returns :class:`Importance`."""
    from ..analysis import importance as imp

    if isinstance(methods, (list, tuple)):
        methods = ",".join(methods)
    seed_list = list(seeds) or [0]
    _check_min("batch_size", batch_size)
    tables = []
    if source is not None:
        if model is not None or data is not None or task is not None or inputs is not None:
            raise OptionError("give either a store or model/data/task, not both")
        wanted = imp.parse_methods(methods or "attr,attention", imp.STORE_METHODS + ("random",))
        st, close = _open(source)
        try:
            chosen = None
            if examples is not None:
                from ..data import parse_examples

                have = st.indices()
                chosen = parse_examples(_spec(examples), (max(have) + 1) if have else 0)
            with progress_for(progress, "importance") as bar:
                ident, tables = imp.from_store(st, [m for m in wanted if m in imp.STORE_METHODS], chosen, bar,
                                               family=family)
        finally:
            close()
    else:
        if family is not None:
            raise OptionError("family goes with a store; with a model, Taylor importance covers the heads attattr masks")
        wanted = imp.parse_methods(methods or "taylor,random", imp.MODEL_METHODS)
        m, _task, picked, label_map, _rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
        with using(m) as m:
            ident = imp.identity_of(m.loaded)
            if "taylor" in wanted:
                with progress_for(progress, "taylor") as bar:
                    t = imp.taylor(m.loaded, picked, label_map, batch_size, normalize, truncate, bar)
                t.source = f"{data or ('memory' if inputs is not None else 'builtin')}"
                tables.append(t)
    if "random" in wanted:
        tables.extend(imp.random_table(ident.num_layers, ident.num_heads, s) for s in seed_list)
    if out is not None:
        written = imp.write(out, ident, tables, _cmd(command))
        return Importance(written.identity, written.tables, str(out))
    return Importance(ident, {t.name: t for t in tables})


def _open(source):
    """(a Store-like reader, its closer) for a path, a StoreView, a Store or a Results list."""
    from ..store import Store

    if isinstance(source, StoreView):
        return source.store, (lambda: None)
    if isinstance(source, Store):
        return source, (lambda: None)
    if isinstance(source, Results) or (isinstance(source, list) and source and isinstance(source[0], Attribution)):
        return _InMemory(source), (lambda: None)
    if isinstance(source, (str, Path)):
        st = Store(source)
        return st, st.close
    raise OptionError(f"source must be a store path, an open store or results of score(), not {type(source).__name__}")


class _InMemory:
    """Results of :func:`score` read like a store (for importance and triggers)."""

    def __init__(self, results):
        self.results = {int(e.index): e for e in results}
        self.path = "results"
        first = results[0]
        shape = np.shape(first.head_max)
        self.provenance = {"label_names": list(first.label_names or []), "model": "results",
                           "num_layers": int(max(first.layers) + 1) if len(first.layers) else int(shape[0]),
                           "num_heads": int(shape[1])}
        self.fingerprint = {}

    def indices(self) -> list[int]:
        return sorted(self.results)

    def families(self) -> list[str]:
        return list(dict.fromkeys(e.family for e in self.results.values()))

    def get(self, index: int, arrays: bool = True, family: str | None = None):
        if index not in self.results:
            raise StoreError(f"example {index} is not in the results")
        return self.results[index]


# ----------------------------------------------------------------------------- predict with masked heads


@dataclass
class Predictions:
    """Class predictions: ``logits`` and ``probabilities`` [example, class] (numpy),
    ``predictions`` (class names), ``gold`` (model class indices, -1 unknown), ``accuracy``
    (over examples with a gold label, None without)."""

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


def predict(model=None, inputs=None, *, data=None, task=None, examples=None, mask=None, batch_size: int = 64,
            truncate: bool = False, device: str = "auto") -> Predictions:
    """Classify ``inputs`` (or data/task rows), optionally with attention heads masked: ``mask``
    a [layer, head] array of 0 (head off) and 1 (on), or scales in between. Returns
    :class:`Predictions`."""
    import torch

    from ..engine.heads import Batches, logits_under

    _check_min("batch_size", batch_size)
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
class PruneResult:
    """What pruning measured: ``curves`` (per method the metric at each rate, against the
    unpruned ``baseline``), ``effectiveness`` (the per-example analysis), ``pruned_model``
    (a saved model with heads removed), each None when not asked for; ``info`` the rest
    of the CURVES.json document."""

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

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.to_dict(), indent=2)


def prune(model=None, importance=None, *, data=None, task=None, examples=None, inputs=None, rates="0:1:0.1",
          methods=None, batch_size: int = 64, keep_heads: float | None = None, save_model=None,
          keep_method: str | None = None, effectiveness=None, ks=None, device: str = "auto",
          truncate: bool = False, out=None, progress=False, command=None) -> PruneResult:
    """Mask the least important heads at each rate (a fraction of all heads) and evaluate, for
    every table of ``importance`` (an :class:`Importance`, or an importance file's path);
    ``rates`` "start:stop:step", a comma string or a list. ``effectiveness``: a store of the
    model on the data: the paper's per-example analysis (``ks`` heads per layer). ``keep_heads``
    with ``save_model``: save a model with only that fraction of heads. ``out``: write the
    JSON document. Returns :class:`PruneResult`."""
    from ..analysis import importance as imp
    from ..analysis import prune as pr
    from ..engine.heads import Batches

    if importance is None and effectiveness is None:
        raise OptionError("nothing to do: give importance (curves) and/or effectiveness (a store)")
    if (keep_heads is None) != (save_model is None):
        raise OptionError("keep_heads and save_model go together")
    if keep_heads is not None and importance is None:
        raise OptionError("keep_heads needs importance to rank the heads")
    _check_min("batch_size", batch_size)
    rate_list = pr.parse_rates(rates) if isinstance(rates, str) else pr.parse_rates(",".join(str(float(r)) for r in rates))
    if importance is None:
        imp_file = None
    elif isinstance(importance, Importance):
        imp_file = importance.as_file()
    else:
        imp_file = imp.read(importance)
    if isinstance(methods, str):
        methods = [x.strip() for x in methods.split(",") if x.strip()]
    if isinstance(ks, str):
        ks = [int(x) for x in ks.split(",") if x.strip()]
    m, task_obj, picked, label_map, rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
    with using(m) as m:
        loaded = m.loaded
        if imp_file is not None:
            imp.check_model(imp_file, loaded)
        task_name = task_obj.name if task_obj else None
        ident = imp.identity_of(loaded)
        res = PruneResult(info={
            "model": ident.model, "weights_sha256": ident.weights_sha256, "model_type": ident.model_type,
            "task": task_name or "generic", "data": data or ("memory" if inputs is not None else "builtin"),
            "examples": _spec(examples) or "all",
            "importance": (imp_file.path if imp_file is not None else None), "command": _cmd(command),
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
        _write_json(out, res.to_dict())
    return res


# ----------------------------------------------------------------------------- triggers


@dataclass
class TriggersResult:
    """Adversarial triggers: ``triggers`` (ranked ``Trigger`` objects: tokens, segments,
    relative positions, count, strength, the class they push towards), ``patterns`` (the
    per-example top entries they come from), ``document`` (the triggers JSON)."""

    triggers: list
    patterns: list
    document: dict
    distinct: int = 0  # distinct triggers before top_k

    def to_dict(self) -> dict:
        """The triggers JSON document (what ``attattr triggers`` writes)."""
        return self.document

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.document, indent=2, ensure_ascii=False)

    def to_csv(self) -> str:
        """One CSV row per trigger."""
        from ..analysis.triggers import triggers_csv

        return triggers_csv(self.triggers)


def triggers(source=None, *, model=None, data=None, task=None, examples=None, inputs=None, steps: int = 20,
             top_k: int | None = None, per_class: bool = False, rank_by: str = "count", special: bool = False,
             min_tokens: int = 0, limit: int | None = None, store=None, device: str = "auto", out=None,
             progress=False, command=None) -> TriggersResult:
    """Adversarial triggers from attention attribution (Hao et al. 2021, section 4). From
    ``source`` (a store path, an open store, or results of :func:`score`), or scored on the fly
    from model and data/inputs (into ``store`` when given, else a temporary one). ``top_k``
    keeps the k best (of each class with ``per_class``); ``rank_by`` count, total or mean.
    ``out``: write JSON (or CSV when it ends in .csv). Returns :class:`TriggersResult`."""
    from ..analysis.triggers import (RANKINGS, aggregate, patterns_from_store, select, select_by_length,
                                     triggers_csv, triggers_document)
    from ..fileio import write_atomic

    if rank_by not in RANKINGS:
        raise OptionError(f"unknown rank_by '{rank_by}'; available: {', '.join(RANKINGS)}")
    _check_min("top_k", top_k)
    _check_min("steps", steps)
    on_the_fly = source is None
    if not on_the_fly and (model is not None or data is not None or task is not None or examples is not None
                           or inputs is not None or store is not None or limit is not None):
        raise OptionError("give either a store (source) or model/data/task/examples to score on the fly, not both")
    tmp = None
    wanted = None
    try:
        if on_the_fly:
            m, _task, picked, _map, rows, _ = model_and_data(model, data, task, examples, inputs, device=device)
            positions = {id(e): k for k, e in enumerate(rows)}
            chosen = select_by_length(m.tokenizer, rows, [positions[id(e)] for e in picked], min_tokens, limit)
            wanted = [rows[i].index for i in chosen]
            if store is None:
                tmp = tempfile.TemporaryDirectory(prefix="attattr-triggers-")
                path = Path(tmp.name) / "scores.h5"
            else:
                path = Path(store)
            score(m, inputs if inputs is None else rows, data=data, task=task, examples=chosen, out=path,
                  steps=steps, device=device, progress=progress, command=command)
            source = path
        st, close = _open(source)
        try:
            prov = st.provenance
            labels = prov.get("label_names") or []
            with progress_for(progress, "triggers") as bar:
                patterns = patterns_from_store(st, progress=bar, min_tokens=min_tokens, special=special, indices=wanted)
        finally:
            close()
        ranked = aggregate(patterns, labels, rank_by=rank_by)
        chosen_t = select(ranked, top_k, per_class, labels)
        src = {
            "store": None if (tmp is not None or not isinstance(source, (str, Path))) else str(source),
            "model": prov.get("model"), "weights_sha256": prov.get("weights_sha256"),
            "task": prov.get("task"), "data": prov.get("data"),
            "options": prov.get("options"), "min_tokens": min_tokens, "special": special, "command": _cmd(command),
        }
        doc = triggers_document(chosen_t, label_names=labels, per_class=per_class, top=top_k, rank_by=rank_by,
                                source=src, patterns=patterns)
    finally:
        if tmp is not None:
            tmp.cleanup()
    res = TriggersResult(chosen_t, patterns, doc, len(ranked))
    if out is not None:
        p = Path(out)
        write_atomic(p, triggers_csv(chosen_t) if p.suffix.lower() == ".csv" else res.to_json() + "\n")
    return res


# ----------------------------------------------------------------------------- attack


@dataclass
class AttackResult:
    """The attack's outcome: ``document`` (the ``attattr attack`` JSON: per gold class the
    accuracy before and under each trigger and control, flips), with shortcuts ``table`` (the
    paper's Table 2 rows), ``before`` (overall accuracy before), ``rows`` (one per trigger
    and control), ``texts`` (the attacked examples, when ``keep_texts``)."""

    document: dict
    texts: list | None = None

    @property
    def table(self) -> list[dict]:
        """Per gold class: n, accuracy before, under each trigger, their mean, the controls' mean."""
        return self.document["table"]

    @property
    def before(self) -> float | None:
        """Overall accuracy before any insertion."""
        return self.document["overall_before"]

    @property
    def rows(self) -> list[dict]:
        """One row per trigger, then per control: tokens, accuracy per class, flipped, ..."""
        return self.document["triggers"] + self.document["controls"]

    def to_dict(self) -> dict:
        """The JSON document."""
        return self.document

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.document, indent=2, ensure_ascii=False)


def _insertions(triggers, top_k):
    from ..analysis.attack import Insertion, from_document
    from ..analysis.triggers import load_triggers

    if isinstance(triggers, TriggersResult):
        return from_document(triggers.document, top_k), None
    if isinstance(triggers, dict):
        return from_document(triggers, top_k), None
    if isinstance(triggers, (str, Path)):
        return from_document(load_triggers(triggers), top_k), str(triggers)
    if isinstance(triggers, (list, tuple)) and all(isinstance(t, Insertion) for t in triggers):
        return list(triggers), None
    raise OptionError("triggers must be a triggers file, its JSON as a dict, a TriggersResult or a list of Insertion")


def attack(model=None, triggers=None, *, data=None, task=None, examples=None, inputs=None, top_k: int | None = 3,
           controls: int | None = None, seed: int = 0, position="relative", batch_size: int = 64,
           keep_texts: bool = False, device: str = "auto", out=None, progress=False) -> AttackResult:
    """Insert triggers (a :class:`TriggersResult`, a triggers file or its dict; the ``top_k``
    best, of each class when made per class) into every example at their relative position
    in their segment, classify again, and compare per gold class with the accuracy before and
    with random-token ``controls`` of the same layout (default one per trigger). ``out``:
    write the JSON. Returns :class:`AttackResult`."""
    from ..analysis.attack import run_attack

    if triggers is None:
        raise OptionError("triggers is required: a TriggersResult, a triggers file or its dict")
    _check_min("batch_size", batch_size)
    _check_min("top_k", top_k)
    chosen, path = _insertions(triggers, top_k)
    m, task_obj, picked, _map, _rows, labels = model_and_data(model, data, task, examples, inputs, device=device)
    with using(m) as m, progress_for(progress, "attack") as bar:
        doc = run_attack(m.loaded, picked, labels, chosen, controls=controls, seed=seed, position=position,
                         batch_size=batch_size, keep_texts=keep_texts, progress=bar)
    doc["data"] = data or ("memory" if inputs is not None else "builtin")
    doc["task"] = task_obj.name if task_obj else ""
    doc["triggers_file"] = path
    texts = doc.pop("texts", None)
    res = AttackResult(doc, texts)
    if out is not None:
        from ..fileio import write_atomic

        write_atomic(Path(out), res.to_json() + "\n")
    return res


# ----------------------------------------------------------------------------- faithfulness


@dataclass
class FaithfulnessResult:
    """The faithfulness report: ``report`` (per method: Kendall tau with leave-one-out and with
    gradients, AOPC comprehensiveness and sufficiency, deletion AUC; per example; the
    permutation test), ``rows`` one flat row per method, ``store`` where token importance is kept."""

    report: dict
    store: str

    @property
    def methods(self) -> dict:
        """Per method its summary numbers."""
        return self.report["methods"]

    @property
    def rows(self) -> list[dict]:
        """One flat row per method (the CSV)."""
        from ..analysis.faithfulness import report_rows

        return report_rows(self.report)

    def to_dict(self) -> dict:
        """The JSON report."""
        return self.report

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self.report, indent=1, allow_nan=False)


def faithfulness(store=None, *, model=None, data=None, task=None, examples=None, methods=None, score_store=None,
                 steps: int = 20, rule: str = "right", target: str = "predicted", output: str = "prob",
                 erase: str = "remove", permutations: int = 20, perm_layers=None, seed: int = 0,
                 device: str = "auto", truncate: bool = False, out=None, progress=False, command=None) -> FaithfulnessResult:
    """Faithfulness of token importance (attention, rollout, attention x gradient, attention
    attribution, gradients, leave-one-out, random) over the examples of ``store`` (a path); or,
    with no store, after scoring model and data into ``score_store`` (default: ``out`` with .h5,
    or a temporary file). Token importance is kept in the store. ``out``: write the JSON report.
    Returns :class:`FaithfulnessResult`."""
    from ..analysis.faithfulness import FaithfulnessOptions, evaluate_store
    from ..analysis.token_importance import ATTRIBUTION_METHODS, ERASE_MODES, METHODS, check_methods

    if isinstance(methods, str):
        methods = methods.split(",")
    chosen = check_methods(list(methods) if methods else list(METHODS))
    if erase not in ERASE_MODES:
        raise OptionError(f"unknown erase '{erase}'; available: {', '.join(ERASE_MODES)}")
    if isinstance(perm_layers, int):
        perm_layers = [perm_layers]
    tmp = None
    try:
        loaded_model = None if model is None or isinstance(model, (str, Path)) else as_model(model)
        if store is None:
            if score_store is not None:
                store = Path(score_store)
            elif out is not None:
                store = Path(out).with_suffix(".h5")
                if store.resolve() == Path(out).resolve():
                    raise OptionError(f"score_store and out are the same file ({out}): give the report a .json name")
            else:
                tmp = tempfile.TemporaryDirectory(prefix="attattr-faithfulness-")
                store = Path(tmp.name) / "scores.h5"
            need_attr = any(m in ATTRIBUTION_METHODS for m in chosen)
            m = loaded_model or as_model(model, device=device)
            score(m, data=data, task=task, examples=examples, out=store, steps=steps, rule=rule, target=target,
                  output=output, layers=None if need_attr else [], truncate=truncate, device=device,
                  progress=progress, command=command)
            from ..data import parse_examples
            from ..engine.run import resolve_inputs

            mid, names = _model_arg(m)
            _, _, rows, _ = resolve_inputs(mid, data, _default_task(mid, data, task, None), names)
            select = [rows[i].index for i in parse_examples(_spec(examples), len(rows))]
            loaded_model = m
        else:
            if data is not None or task is not None:
                raise OptionError("give either a store or model/data/task, not both")
            select = examples
        fopts = FaithfulnessOptions(methods=chosen, examples=select, permutations=permutations,
                                    perm_layers=None if perm_layers is None else list(perm_layers), erase=erase,
                                    seed=seed)
        model_id = str(model) if isinstance(model, (str, Path)) else None
        if loaded_model is not None:
            with using(loaded_model) as mm, progress_for(progress, "faithfulness") as bar:
                report = evaluate_store(store, fopts, device=device, loaded=mm.loaded, progress=bar)
        else:
            with progress_for(progress, "faithfulness") as bar:
                report = evaluate_store(store, fopts, model=model_id, device=device, progress=bar)
        report["command"] = _cmd(command)
        res = FaithfulnessResult(report, None if tmp is not None else str(store))
    finally:
        if tmp is not None:
            tmp.cleanup()
    if out is not None:
        from ..fileio import write_atomic

        write_atomic(Path(out), (res.to_json() + "\n").encode())
    return res


# ----------------------------------------------------------------------------- finetune, merge, import


def finetune(model=None, *, out, data=None, task=None, examples=None, eval_data=None, max_examples: int | None = None,
             epochs: float = 1.0, lr: float = 1e-4, warmup: float = 0.0, batch_size: int = 32, max_length: int = 128,
             freeze_embeddings: bool = False, weight_decay: float = 0.01, threads: int = 0, seed: int = 0,
             overwrite: bool = False, progress=False, command=None):
    """Fine-tune a sequence classifier (a folder or hub id; None: the built-in default on the
    synthetic task's training set, evaluated on its held-out set) on ``data`` and save a
    standard model folder to ``out``. Returns the ``FinetuneReport`` (steps, seconds, final
    loss, eval accuracy, parameters)."""
    from ..data import get_task, load_examples, parse_examples, synthetic
    from ..engine.finetune import FinetuneOptions, check_out
    from ..engine.finetune import finetune as run_finetune
    from ..models.default import DEFAULT_MODEL_DIR

    if isinstance(model, Model):
        if model.path is None:
            raise OptionError("finetune starts from a saved model: give its folder or hub id")
        model = model.path
    if model is not None and not isinstance(model, (str, Path)):
        raise OptionError("finetune starts from a saved model: give its folder or hub id")
    check_out(out, overwrite)
    if model is None and data is None and task is None:
        task = "synthetic"
    task_obj = get_task(task) if task else None
    if task_obj is not None and task_obj.builtin:
        if data is not None:
            raise OptionError("the synthetic task trains on the built-in set; leave out data")
        model = str(model or DEFAULT_MODEL_DIR)
        train_all = synthetic.train_set(2000)
        labels = tuple(synthetic.LABELS)
        evals = synthetic.heldout() if eval_data is None else None
    else:
        if data is None:
            raise OptionError("a model to fine-tune needs data (a training file), or leave out both for the built-in task")
        if model is None:
            raise OptionError("data needs a model (a local model folder to fine-tune)")
        train_all, labels = load_examples(data, task_obj)
        evals = None
    if eval_data is not None:
        evals, _ = load_examples(eval_data, task_obj, list(labels))
    chosen = parse_examples(_spec(examples), len(train_all))
    if max_examples is not None:
        _check_min("max_examples", max_examples)
        chosen = chosen[:max_examples]
    train = [train_all[i] for i in chosen]
    options = FinetuneOptions(epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length,
                              freeze_embeddings=freeze_embeddings, weight_decay=weight_decay, warmup=warmup,
                              seed=seed, threads=threads)
    provenance = {"task": task_obj.name if task_obj else "generic", "data": data or "builtin",
                  "eval_data": eval_data or ("builtin" if evals else ""), "command": _cmd(command)}
    with progress_for(progress, "finetune") as bar:
        return run_finetune(str(model), train, labels, out, options, evals, bar, overwrite, provenance)


def merge(shards: Sequence, out, *, partial: bool = True) -> dict:
    """Merge stores (shards of one run, or runs with the same fingerprint) into ``out``;
    returns what was added and skipped."""
    from ..store import merge as merge_stores

    if isinstance(shards, (str, Path)):
        raise OptionError("shards must be a list of store paths")
    return merge_stores([str(s) for s in shards], out, partial=partial)


def import_2021(attr_path, tokens_path, out, *, model: str | None = None, example: int | None = None,
                labels: Sequence[str] | None = None, attention_path=None, store_dtype: str = "float32", command=None):
    """Import one example of the 2021 code's output (its attribution matrices and tokens
    file) into the store ``out``; returns the import report."""
    from ..analysis.legacy import import_2021 as run_import

    return run_import(attr_path, tokens_path, out, model=model, example=example, labels=labels,
                      attention_path=attention_path, command=_cmd(command), store_dtype=store_dtype)
