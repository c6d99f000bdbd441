"""Pruning curves (:func:`curves`, :func:`pair_curves`: the least important ``round(rate * L * H)``
heads of one global ranking masked at once, with bootstrap bands and paired tests), the
paper's per-example effectiveness analysis (:func:`effectiveness`), and really pruned
BERT-family models (:func:`kept_heads`, :func:`prune_copy`, :func:`save_pruned`; see
assets/modeling_attattr_pruned.py). docs/method.md section 2.2; docs/pruning.md, "Pruning
curves", "The effectiveness analysis" and "Really pruned models".

No printing here.
"""

from __future__ import annotations

import copy
import json
import math
import shutil
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from ..errors import ModelError, OptionError
from ..fileio import swap_dir_in, temp_dir_for, writing
from .ablation import MASK_TOKENS, counting, per_pair_metrics, ratio, under_masks
from .importance import METHODS as TABLE_ORDER, ImportanceFile
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity

Progress = Callable[[int, int, str], None]

SLICEABLE = ("bert", "roberta", "electra")
REMOTE_FILE = Path(__file__).resolve().parent.parent / "assets" / "modeling_attattr_pruned.py"
REMOTE_CLASSES = {
    "bert": "AttattrPrunedBertForSequenceClassification",
    "roberta": "AttattrPrunedRobertaForSequenceClassification",
    "electra": "AttattrPrunedElectraForSequenceClassification",
}


# ----------------------------------------------------------------------------- rates, ranking


def parse_rates(spec: str) -> list[float]:
    """``0:1:0.1`` (start:stop:step, stop included) or ``0,0.5,0.7``; each in [0, 1]."""
    spec = spec.strip()
    try:
        if ":" in spec:
            parts = [float(x) for x in spec.split(":")]
            if len(parts) != 3 or parts[2] <= 0:
                raise ValueError
            a, b, s = parts
            n = int(math.floor((b - a) / s + 1e-9))
            rates = [round(a + i * s, 10) for i in range(n + 1)]
        else:
            rates = [float(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise OptionError(f"bad rates '{spec}' (--rates): give start:stop:step such as 0:1:0.1, or a list such as 0,0.5,0.7") from None
    if not rates or any(r < 0 or r > 1 for r in rates):
        raise OptionError(f"bad rates '{spec}' (--rates): rates are fractions of the heads, between 0 and 1")
    return rates


def ranking(values: np.ndarray) -> np.ndarray:
    """Flat head indices (layer * H + head), least important first; ties by index."""
    return np.argsort(np.asarray(values, np.float64).ravel(), kind="stable")


def mask_at(values: np.ndarray, rate: float) -> torch.Tensor:
    """[layer, head] of 1 (kept) and 0 (masked): the least important round(rate * L * H) heads masked."""
    L, H = values.shape
    k = int(round(rate * L * H))
    m = torch.ones(L * H)
    m[torch.as_tensor(ranking(values)[:k].copy())] = 0
    return m.view(L, H)


# ----------------------------------------------------------------------------- many masks per pass


def logits_under_masks(loaded, batches, masks: Sequence[torch.Tensor], max_tokens: int = MASK_TOKENS,
                       on_masks: Callable[[int], None] | None = None) -> list[torch.Tensor]:
    """Logits [examples, labels] (float32, CPU, the examples' order) under each head mask:
    ``[layer, head]`` for every example, or ``[examples, layer, head]`` one per example, several
    masks per pass (:func:`ablation.under_masks`, ``engine.heads.masked`` with a per-row scale):
    the numbers of ``logits_under`` with one mask, up to the float rounding of a batch of
    another size. ``on_masks(k)``: after each group of k masks."""
    from ..engine.heads import masked

    def run(b, gate):
        copies = gate.shape[0] // b.inputs["input_ids"].shape[0]
        with masked(loaded.model, gate.to(batches.device)):
            return loaded.model(**{k: v.repeat(copies, *([1] * (v.dim() - 1))) for k, v in b.inputs.items()}
                                ).logits.float().cpu()

    with torch.no_grad():
        return under_masks(batches.batches, masks, run, batches.n, max(
            (b.inputs["input_ids"].numel() for b in batches.batches), default=1), max_tokens, on_masks)


# ----------------------------------------------------------------------------- metrics


def metric_name(task_name: str | None) -> str:
    return "f1" if task_name == "mrpc" else "accuracy"


def scores(logits: torch.Tensor, gold: torch.Tensor, task_name: str | None, positive: int = 1) -> dict:
    """accuracy and the task's metric (F1 of the positive class for MRPC, else accuracy)."""
    known = gold >= 0
    pred = logits.argmax(-1)
    n = int(known.sum())
    acc = float((pred[known] == gold[known]).float().mean()) if n else float("nan")
    out = {"accuracy": acc}
    if metric_name(task_name) == "f1":
        p, g = pred[known] == positive, gold[known] == positive
        tp = int((p & g).sum())
        prec = tp / max(int(p.sum()), 1)
        rec = tp / max(int(g.sum()), 1)
        out["f1"] = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return out


# ----------------------------------------------------------------------------- curves


def _tables(imp: ImportanceFile, methods: Sequence[str] | None) -> list:
    """The tables of ``imp`` asked for (every one by default), in the importance registry's order
    (attr, taylor, attention, random), then the rest."""
    order = {m: i for i, m in enumerate(TABLE_ORDER)}
    tables = sorted((t for t in imp.tables.values() if methods is None or t.method in methods or t.name in methods),
                    key=lambda t: (order.get(t.method, len(order)), t.name))
    if not tables:
        raise OptionError(f"{imp.path} holds none of the methods asked for; it has {', '.join(imp.tables)}")
    return tables


def _distinct(tables, rates, first: Sequence[torch.Tensor] = ()) -> dict[bytes, torch.Tensor]:
    """``first``, then every distinct mask of every table at every rate (each runs once), by its bytes."""
    distinct = {m.numpy().tobytes(): m for m in first}
    for t in tables:
        for r in rates:
            m = mask_at(t.values, r)
            distinct.setdefault(m.numpy().tobytes(), m)
    return distinct


def _grouped_curves(tables, rates, cache: dict, entry: Callable, merge: Callable) -> tuple[dict, dict, dict]:
    """Each table's curve over ``rates`` from ``cache`` (the result of each distinct mask):
    ``entry(rows)`` gives the table's per-example array [examples, rates] and its curve's fields;
    the tables of one method (random-0, random-1, ...) are averaged into one curve whose fields
    ``merge(names, per_table, each)`` gives. Returns per_table, each (the arrays by table) and
    the curves by method."""
    per_table: dict[str, dict] = {}
    each: dict[str, np.ndarray] = {}
    for t in tables:
        each[t.name], fields = entry([cache[mask_at(t.values, r).numpy().tobytes()] for r in rates])
        per_table[t.name] = {"method": t.method, **fields,
                             "heads_masked": [int(round(r * t.values.size)) for r in rates]}
    groups: dict[str, list[str]] = {}
    for t in tables:
        groups.setdefault(t.method, []).append(t.name)
    methods = {method: per_table[method] if group == [method] else {
        "method": method, **merge(group, per_table, each), "heads_masked": per_table[group[0]]["heads_masked"],
        "tables": {n: per_table[n] for n in group}} for method, group in groups.items()}
    return per_table, each, methods


def _document(metric: str, rates, n: int, shape, baseline: dict, methods: dict, level: float, tests: str,
              **extra) -> dict:
    """The curves' document (CURVES.json's ``curves``); ``extra`` goes after the baseline."""
    return {"metric": metric, "rates": list(rates), "n_examples": n, "num_layers": int(shape[0]),
            "num_heads": int(shape[1]), "baseline": baseline, **extra, "methods": methods, "level": level,
            "tests": tests}


def curves(loaded, batches, imp: ImportanceFile, rates: Sequence[float], task_name: str | None = None,
           methods: Sequence[str] | None = None, progress: Progress | None = None, level: float = 0.95,
           seed: int = 0, max_tokens: int = MASK_TOKENS) -> dict:
    """Metric at every rate for every table of ``imp`` (random seeds averaged), one baseline,
    with bootstrap bands and paired tests (:func:`curve_statistics`). The masks run several
    per pass (:func:`logits_under_masks`, ``max_tokens``)."""
    from . import stats

    gold = batches.gold()
    known = gold >= 0
    metric = metric_name(task_name)
    tables = _tables(imp, methods)
    # the baseline is rate 0's mask, every head kept
    ones = torch.ones(tables[0].values.shape)
    distinct = _distinct(tables, rates, [ones])
    cache = {key: scores(logits, gold, task_name) | {"_correct": (logits.argmax(-1)[known] == gold[known]).numpy()}
             for key, logits in zip(distinct, logits_under_masks(loaded, batches, list(distinct.values()), max_tokens,
                                                                 counting(progress, len(distinct), "masks")))}
    baseline = {k: v for k, v in cache[ones.numpy().tobytes()].items() if not k.startswith("_")}

    def entry(rows):
        curve = {"accuracy": [x["accuracy"] for x in rows], metric: [x[metric] for x in rows]}
        return np.stack([x["_correct"] for x in rows], axis=1), curve  # [examples, rates]

    def merge(group, per_table, _each):
        return {"accuracy": np.mean([per_table[n]["accuracy"] for n in group], axis=0).tolist(),
                metric: np.mean([per_table[n][metric] for n in group], axis=0).tolist(),
                "accuracy_std": np.std([per_table[n]["accuracy"] for n in group], axis=0).tolist()}

    per_table, correct, result_methods = _grouped_curves(tables, rates, cache, entry, merge)
    curve_statistics(result_methods, per_table, correct, level, seed)
    shape = imp.identity.num_layers, imp.identity.num_heads
    return _document(metric, rates, batches.n, shape, baseline, result_methods, level,
                     "per rate: attr against each method on the same examples, one-sided (attr keeps more right): "
                     "exact McNemar; against random a paired sign-flip test on the mean over the seeds "
                     f"({stats.RESAMPLES:,} random sign patterns, so p >= 1/{stats.RESAMPLES + 1:,} before Holm); "
                     "p_holm: Holm over the rates of one comparison. Bands: percentile bootstrap over examples")


def curve_statistics(result_methods: dict, per_table: dict, correct: dict, level: float = 0.95, seed: int = 0
                     ) -> None:
    """Add bootstrap bands (accuracy over examples) to every curve and paired tests of attr
    against every other method at every rate."""
    from . import stats

    per_method: dict[str, np.ndarray] = {}
    for name, entry in result_methods.items():
        names = list(entry["tables"]) if "tables" in entry else [name]
        mats = np.stack([correct[n].astype(np.float64) for n in names], axis=1)  # [examples, seeds, rates]
        per_method[name] = mats.mean(axis=1)  # [examples, rates]: share of the seeds right
        if len(names) > 1:
            # the seeds are resampled too (with replacement, alongside the examples), so the
            # band of the random mean covers the orders' own spread as well as the examples'
            pick = np.random.default_rng([seed, 1])
            k = len(names)
            lo, hi = stats.bootstrap_ci(mats, lambda a: a[:, pick.integers(0, k, k), :].mean(axis=(0, 1)),
                                        level=level, seed=seed)
        else:
            lo, hi = stats.bootstrap_ci(per_method[name], level=level, seed=seed)
        entry["accuracy_low"] = [_num(x) for x in lo]
        entry["accuracy_high"] = [_num(x) for x in hi]
        if len(names) > 1:
            accs = np.asarray([per_table[n]["accuracy"] for n in names])
            entry["seeds"] = len(names)
            entry["accuracy_seed_min"] = accs.min(0).tolist()
            entry["accuracy_seed_max"] = accs.max(0).tolist()
    if "attr" in result_methods:
        result_methods["attr"]["tests"] = _attr_tests(
            per_method, {n for n in per_method if n in correct and "tables" not in result_methods[n]}, seed)


def _attr_tests(per_method: dict, exact=(), seed: int = 0) -> dict:
    """attr against each other method at every rate ([examples, rates] each), one-sided (attr
    higher), Holm over the rates: exact McNemar of the examples right for the methods in
    ``exact``, else a paired sign-flip test (on the seeds' mean where a method has several)."""
    from . import stats

    a, tests = per_method["attr"], {}
    for name, m in per_method.items():
        if name != "attr":
            rows = [stats.mcnemar(a[:, j] > 0.5, m[:, j] > 0.5, "greater") if name in exact
                    else stats.paired_test(a[:, j], m[:, j], "greater", seed=seed + j) for j in range(a.shape[1])]
            ps = [r["p"] for r in rows]
            tests[name] = {"p": ps, "p_holm": stats.holm(ps), "difference": [
                r["difference" if name in exact else "statistic"] for r in rows],
                "test": "mcnemar" if name in exact else "sign-flip"}
    return tests


def _num(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


# ----------------------------------------------------------------------------- language-model pairs


class PairBatches:
    """Clean / counterfactual pairs of a causal LM (data/pairs.py) as examples, encoded once: a
    circuits ``CircuitTask`` (``task``: the pairs grouped by token length, no padding) whose
    pruned heads are ablated by ``ablation`` (zero by default; mean; patching, the counterfactual
    run). ``metric`` (engine/metrics.py) is what an evaluation takes of the next-token logits
    after each prompt."""

    def __init__(self, loaded, examples, metric: str = "logit-diff", batch_size: int = 64, ablation: str = "zero"):
        from ..data.pairs import pair_of_example
        from .circuits.task import CircuitTask

        self.task = CircuitTask(loaded, [pair_of_example(e) for e in examples], metric, batch_size)
        self.metric, self.ablation, self.n = metric, ablation, self.task.n


def pair_curves(loaded, batches: PairBatches, imp: ImportanceFile, rates: Sequence[float],
                methods: Sequence[str] | None = None, progress: Progress | None = None, level: float = 0.95,
                seed: int = 0, max_tokens: int = MASK_TOKENS) -> dict:
    """The pruning curves of a language-model pair task: at each rate the mean ``metric``
    (``batches.metric``: the logit difference answer - foil by default) of the pairs with the
    least important heads ablated (``batches.ablation``: zeroed by default), per table of ``imp``
    (random seeds averaged), against the unpruned model; ``zeroed`` is the metric with every
    head ablated, and ``faithfulness`` per rate (m(kept) - m(none kept)) / (m(all) - m(none
    kept)) (:func:`ablation.ratio`). Bands: bootstrap over the pairs; tests: attr keeps the
    metric higher than each other method (paired sign-flip, Holm)."""
    from . import stats
    from .circuits.task import Context

    metric = batches.metric
    tables = _tables(imp, methods)
    L, H = tables[0].values.shape
    every_none = torch.ones(L, H), torch.zeros(L, H)  # every head kept, none: rates 0 and 1 are these masks
    distinct = _distinct(tables, rates, every_none)
    ctx = Context(batches.task, batches.ablation, progress=progress)
    cache = dict(zip(distinct, per_pair_metrics(ctx, torch.stack(list(distinct.values())), max_tokens)))
    full, none_kept = (float(cache[m.numpy().tobytes()].mean()) for m in every_none)

    def curve(per_example: np.ndarray) -> dict:
        values = per_example.mean(0).tolist()
        return {metric: values, "faithfulness": [_num(f + 0.0) for f in ratio(values, full, none_kept)]}

    def entry(rows):
        per_example = np.stack(rows, axis=1)  # [examples, rates]
        return per_example, curve(per_example)

    def merge(group, per_table, each):
        seeds = np.asarray([per_table[n][metric] for n in group])
        return curve(np.mean([each[n] for n in group], axis=0)) | {
            "seeds": len(group), f"{metric}_seed_min": seeds.min(0).tolist(),
            f"{metric}_seed_max": seeds.max(0).tolist()}

    _, each, result = _grouped_curves(tables, rates, cache, entry, merge)
    per_method = {}
    for method, entry_ in result.items():
        per_method[method] = np.mean([each[n] for n in entry_.get("tables", [method])], axis=0)
        lo, hi = stats.bootstrap_ci(per_method[method], level=level, seed=seed)
        entry_[f"{metric}_low"] = [_num(x) for x in lo]
        entry_[f"{metric}_high"] = [_num(x) for x in hi]
    if "attr" in per_method:
        result["attr"]["tests"] = _attr_tests(per_method, seed=seed)
    return _document(metric, rates, batches.n, (L, H), {metric: full}, result, level,
                     "per rate: attr against each method on the same pairs, one-sided (attr keeps the metric higher):"
                     " paired sign-flip test; p_holm: Holm over the rates of one comparison. Bands: percentile"
                     " bootstrap over the pairs. faithfulness: (m(pruned) - m(every head zeroed)) / (m(unpruned) -"
                     " m(every head zeroed))", zeroed={metric: none_kept})


# ----------------------------------------------------------------------------- effectiveness


def effectiveness(loaded, batches, attr: np.ndarray, attn: np.ndarray, ks: Sequence[int],
                  task_name: str | None = None, progress: Progress | None = None, level: float = 0.95,
                  seed: int = 0, max_tokens: int = MASK_TOKENS) -> dict:
    """The paper's effectiveness analysis.

    attr, attn: per-example scores [examples, layer, head] in the order of the examples of
    ``batches`` (attribution head max and attention head max of each example).
    For each layer l and each k: mask, per example, the k heads of layer l ranked by the
    example's own score (small first / large first), others intact; accuracy averaged over
    the layers. Returns the table (orders x ks) and the per-layer accuracies.
    """
    from ..engine.heads import logits_under

    n, L, H = attr.shape
    gold = batches.gold()
    orders = {f"{name}_{side}_first": (score, side == "large") for name, score in (("attr", attr), ("attention", attn))
              for side in ("small", "large")}
    total = len(orders) * len(ks) * L
    out: dict[str, dict] = {}
    each: dict[str, np.ndarray] = {}
    for name, (score, large) in orders.items():
        sc = torch.as_tensor(score, dtype=torch.float64)
        rank = torch.argsort(-sc if large else sc, dim=-1, stable=True)  # [n, L, H]
        per_layer = np.zeros((len(ks), L))
        right = np.zeros((n, len(ks)))  # per example: the share of the layers it stays right
        known = (gold >= 0).numpy()
        masks = []  # every (k, layer) of this order, several per pass
        for k in ks:
            for layer in range(L):
                m = torch.ones(n, L, H)
                m[:, layer, :].scatter_(1, rank[:, layer, :k], 0.0)
                masks.append(m)

        every = iter(logits_under_masks(loaded, batches, masks, max_tokens,
                                        counting(progress, total, name, len(masks) * list(orders).index(name))))
        for ki in range(len(ks)):
            for layer in range(L):
                logits = next(every)
                per_layer[ki, layer] = scores(logits, gold, task_name)["accuracy"]
                right[:, ki] += (logits.argmax(-1) == gold).numpy() / L
        out[name] = {"accuracy": per_layer.mean(1).tolist(), "per_layer": per_layer.tolist()}
        each[name] = right[known]
    effectiveness_statistics(out, each, level, seed)
    base = scores(logits_under(loaded, batches, None), gold, task_name)["accuracy"]
    return {"ks": list(ks), "n_examples": n, "num_layers": L, "num_heads": H, "baseline_accuracy": base,
            "orders": out, "level": level,
            "tests": ("per k, on the same examples (each example's share of layers right): attribution small-first "
                      "keeps more than attention small-first, attribution large-first keeps less than attention "
                      "large-first; paired sign-flip permutation tests, one-sided, Holm over the ks")}


def effectiveness_statistics(out: dict, each: dict, level: float = 0.95, seed: int = 0) -> None:
    """Bootstrap bands over the examples for every order, and the paired tests of attribution
    against attention (small-first: attribution should keep more; large-first: less)."""
    from . import stats

    for name, entry in out.items():
        lo, hi = stats.bootstrap_ci(each[name], level=level, seed=seed)
        entry["accuracy_low"] = [_num(x) for x in lo]
        entry["accuracy_high"] = [_num(x) for x in hi]
    for side, better in (("small_first", "greater"), ("large_first", "less")):
        a, b = each.get(f"attr_{side}"), each.get(f"attention_{side}")
        if a is None or b is None:
            continue
        rows = [stats.paired_test(a[:, j], b[:, j], better, seed=seed + j) for j in range(a.shape[1])]
        ps = [r["p"] for r in rows]
        out[f"attr_{side}"]["test_vs_attention"] = {
            "alternative": better, "difference": [r["statistic"] for r in rows], "p": ps, "p_holm": stats.holm(ps)}


# ----------------------------------------------------------------------------- real pruning


def kept_heads(values: np.ndarray, keep: float) -> list[list[int]]:
    """Per layer, the original indices of the heads kept when the most important
    ``round(keep * L * H)`` heads (one global ranking) stay."""
    if not 0 <= keep <= 1:
        raise OptionError(f"keep_heads (--keep-heads) {keep}: a fraction of the heads between 0 and 1")
    L, H = values.shape
    mask = mask_at(values, 1 - keep)
    return [[h for h in range(H) if mask[layer, h] > 0] for layer in range(L)]


def _remote():
    import importlib.util

    spec = importlib.util.spec_from_file_location("attattr_modeling_attattr_pruned", REMOTE_FILE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def check_sliceable(model) -> None:
    mt = getattr(model.config, "model_type", "")
    if mt not in SLICEABLE or type(model).__name__ not in (
            "BertForSequenceClassification", "RobertaForSequenceClassification", "ElectraForSequenceClassification",
            *REMOTE_CLASSES.values()):
        raise ModelError(f"saving a pruned model (save_model, --save-model) slices heads of BERT-family encoders ({', '.join(SLICEABLE)}); "
                         f"this model is '{mt}' ({type(model).__name__}). Use the masked curves instead")
    if getattr(model.config, "attattr_kept_heads", None) is not None:
        raise ModelError("this model is already pruned by attattr; prune the original model instead")


def prune_copy(model, kept: list[list[int]]):
    """A copy of ``model`` with only the kept heads (weights sliced), for BERT-family encoders."""
    check_sliceable(model)
    pruned = copy.deepcopy(model)
    _remote().prune_model(pruned, kept)
    pruned.config.attattr_kept_heads = [list(map(int, k)) for k in kept]
    return pruned


def save_pruned(model, tokenizer, kept: list[list[int]], out: str | Path, overwrite: bool = False,
                extra: dict | None = None):
    """Slice and save into ``out`` (temp folder then rename); returns the pruned model."""
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise OptionError(f"--save-model {out} exists and is not empty; it was left as it is (choose another save_model / --save-model)")
    pruned = prune_copy(model, kept)
    mt = model.config.model_type
    pruned.config.auto_map = {"AutoModelForSequenceClassification": f"modeling_attattr_pruned.{REMOTE_CLASSES[mt]}"}
    tmp = temp_dir_for(out)
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        with writing(out):  # a full disk or ulimit -f in safetensors: the one line
            pruned.save_pretrained(tmp, safe_serialization=True)
        cfg = json.loads((tmp / "config.json").read_text())
        cfg["architectures"] = [REMOTE_CLASSES[mt]]  # save_pretrained writes the in-memory class's name
        (tmp / "config.json").write_text(strict_dumps(cfg, indent=2, sort_keys=True) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        with writing(out):
            shutil.copyfile(REMOTE_FILE, tmp / REMOTE_FILE.name)
        (tmp / "PRUNING.json").write_text(strict_dumps({"kept_heads": kept, **(extra or {})}, indent=2) + "\n")
        swap_dir_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return pruned


def load_pruned(folder: str | Path):
    """Load a folder written by :func:`save_pruned` with plain transformers."""
    from transformers import AutoModelForSequenceClassification

    return AutoModelForSequenceClassification.from_pretrained(str(folder), trust_remote_code=True).eval()


def count_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def time_forward(model, batches, repeats: int = 3) -> float:
    """Best-of-``repeats`` seconds for one pass over ``batches`` (plain attention, no masking)."""
    best = float("inf")
    with torch.no_grad():
        for _ in range(repeats):
            t0 = time.perf_counter()
            for b in batches.batches:
                model(**b.inputs)
            best = min(best, time.perf_counter() - t0)
    return best


# ----------------------------------------------------------------------------- over a store, saving


def effectiveness_from_store(loaded, store_path, all_examples, picked, label_map, ks: Sequence[int] | None = None,
                             batch_size: int = 64, truncate: bool = False, task_name: str | None = None,
                             progress: Progress | None = None) -> dict:
    """The effectiveness analysis on the examples of the store at ``store_path`` that are among
    ``picked``: per-example attribution (head_max) against per-example attention, read from the
    store, which must hold the model's per-head maps of every layer. ``ks`` default 2, 4, ..., H."""
    from ..engine.heads import Batches
    from ..engine.run import data_digest
    from ..errors import StoreError
    from ..store import Store
    from .importance import head_values, store_family

    with Store(store_path) as st:
        fp = st.fingerprint
        if fp.get("weights_sha256") != loaded.weights_sha256:
            raise StoreError(f"{store_path} was scored with another model than the one given (weights differ)")
        if fp.get("data_sha256") not in (None, data_digest(all_examples)):
            raise StoreError(f"{store_path} was scored on other data than the data given; give the data it was scored on")
        wanted = {e.index for e in picked}
        idx = [i for i in st.indices() if i in wanted]
        if not idx:
            raise StoreError(f"{store_path} holds none of the selected examples")
        idx, skipped = st.finite(idx)
        if not idx:
            raise StoreError(f"every selected example in {store_path} holds NaN or inf (flagged 'nonfinite')")
        st_unconverged = st.unconverged(idx)
        L, H = loaded.arch.num_layers, loaded.arch.num_heads
        # self or encoder: the heads attattr can mask
        values = head_values(st, idx, ("attr", "attention"), L, H, store_family(st),
                             dict.fromkeys(("attr", "attention"), "the effectiveness analysis"))
    by_index = {e.index: e for e in all_examples}
    chosen = [by_index[i] for i in idx]
    k_list = list(ks) if ks else (list(range(2, H + 1, 2)) or [H])
    if k_list[-1] != H and not ks:
        k_list.append(H)
    batches = Batches(loaded, chosen, label_map, batch_size, truncate)
    return effectiveness(loaded, batches, values["attr"], values["attention"], k_list, task_name, progress) | {
        "store": str(store_path), "skipped_nonfinite": skipped, "unconverged": len(st_unconverged), "used": len(idx)}


def save_and_compare(loaded, imp: ImportanceFile, keep: float, keep_method: str | None, folder: str | Path,
                     batches) -> dict:
    """Save a model with only the fraction ``keep`` of its heads (the most important by the
    table ``keep_method``, default attr or the file's first) into ``folder``, reload it, and
    compare it with the head-masked model on ``batches``: logits, parameters, time."""
    from ..engine.heads import logits_under

    names = list(imp.tables)
    name = keep_method or ("attr" if "attr" in names else names[0])
    if name not in imp.tables:
        raise OptionError(f"keep method {name}: {imp.path} has {', '.join(names)}")
    values = imp.tables[name].values
    kept = kept_heads(values, keep)
    check_sliceable(loaded.model)
    save_pruned(loaded.model, loaded.tokenizer, kept, folder,
                extra={"keep": keep, "method": name, "importance": imp.path})
    reloaded = load_pruned(folder).to(next(loaded.model.parameters()).device)
    mask = mask_at(values, 1 - keep)
    masked = logits_under(loaded, batches, mask)
    with torch.no_grad():
        real = torch.empty_like(masked)
        for b in batches.batches:
            real[b.positions] = reloaded(**b.inputs).logits.float().cpu()
    diff = float((masked - real).abs().max()) if masked.numel() else 0.0
    full_params, pruned_params = count_params(loaded.model), count_params(reloaded)
    t_full = time_forward(loaded.model, batches)
    t_pruned = time_forward(reloaded, batches)
    return {
        "folder": str(folder), "method": name, "keep": keep,
        "heads_kept": sum(len(k) for k in kept), "heads_total": int(values.size), "kept_heads": kept,
        "params_unpruned": full_params, "params_pruned": pruned_params,
        "seconds_unpruned": t_full, "seconds_pruned": t_pruned, "speedup": t_full / t_pruned if t_pruned else None,
        "max_abs_logit_diff_vs_masked": diff,
        "agreement_vs_masked": float((masked.argmax(-1) == real.argmax(-1)).float().mean()) if masked.numel() else 1.0,
        "n_examples": batches.n,
    }
