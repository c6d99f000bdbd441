"""Head importance tables and the importance file IMP.h5: ``attr`` and ``attention``
(from a store), ``taylor`` (model + data) and seeded ``random`` tables, each float64
``[layer, head]``, larger = more important. Definitions: docs/method.md section 2.1;
the methods table, the stability attributes and the IMP.h5 layout (schema
``attattr.importance`` 1.0): docs/pruning.md, "Importance tables" and "IMP.h5".

No printing here; the CLI draws the heatmap.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Sequence

import h5py
import numpy as np
import torch

from .. import __version__
from ..data.types import Example
from ..errors import OptionError, StoreError
from ..fileio import is_stream, replaced
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity
from ..registry import Registry

SCHEMA = "attattr.importance"
SCHEMA_VERSION = "1.0"
SCHEMA_MAJOR = 1


@dataclass(frozen=True)
class TableMethod:
    """A head importance table of ``attattr importance`` (module docstring): ``tasks`` the inputs
    it is computed from (``store``, ``data``: a classifier's examples, ``pairs``: clean /
    counterfactual pairs), how plots draw it. On pairs every head method of ``attattr circuit``
    is one more table (:func:`methods_for`)."""

    name: str
    description: str
    tasks: tuple[str, ...]
    kind: str = "other"
    cost: str = ""
    reference: str = ""
    label: str = ""  # its name in plots
    color: str = "tab:purple"


TABLES = Registry("importance method", units="heads", command="importance")
for _m in (TableMethod("attr", "E_x max_ij Attr_h(A) (signed), from the store's head_max", ("store",), "attribution",
                       "none (reads the store)", "Hao et al. 2021", "attribution", "tab:blue"),
           TableMethod("taylor", "E_x |<dL/dO_h, O_h>|, unit L2 norm per layer (pairs: the gradient of the metric)",
                       ("data", "pairs"), "gradient", "1 forward and backward per batch", "Michel et al. 2019",
                       "Taylor", "tab:green"),
           TableMethod("attention", "E_x max_ij A_h (the paper's attention baseline), from the store's maps",
                       ("store",), "attention", "none (reads the store)", "Hao et al. 2021", "attention", "tab:red"),
           TableMethod("random", "a seeded uniform table per seed (--seeds), the floor every method must beat",
                       ("store", "data", "pairs"), "baseline", "none", "", "random", "tab:gray")):
    TABLES.register(_m)
STORE_METHODS = TABLES.built_in(lambda m: "store" in m.tasks and m.kind != "baseline")
METHODS = TABLES.built_in()
INPUTS = {"store": "a store (attattr importance STORE ...)",
         "data": "--model and --data (no store)",
         "pairs": "clean / counterfactual pairs (--data a JSONL of pairs, --model a causal language model)"}

Progress = Callable[[int, int, str], None]


@dataclass
class Identity:
    """Which model a table belongs to (by weights, as the store's fingerprint)."""

    weights_sha256: str
    model: str
    model_type: str
    num_layers: int
    num_heads: int

    def describe(self) -> str:
        return f"{self.model} ({self.num_layers} layers x {self.num_heads} heads, weights sha256 {self.weights_sha256[:12]}...)"


@dataclass
class Table:
    name: str  # dataset name: attr, attention, taylor, random-0, ...
    method: str  # attr, attention, taylor, random
    values: np.ndarray  # [layer, head]
    examples: list[int] = field(default_factory=list)
    seed: int | None = None
    source: str = ""
    description: str = ""
    skipped_nonfinite: int = 0  # store examples left out because they hold NaN or inf
    unconverged: int = 0  # store examples used with a layer whose integral is not converged
    stability: dict | None = None  # tau_halves, rank_low/rank_high [layer, head], level, examples


def stability(per_example: np.ndarray, *, resamples: int = 1000, level: float = 0.95, seed: int = 0) -> dict:
    """How stable the ranking of the mean of ``per_example`` [examples, layer, head] is:
    per head its bootstrap rank interval (1 = most important) and Kendall's tau-b between the
    means over two random halves of the examples (None with fewer than 4 examples)."""
    from . import stats

    x = np.asarray(per_example, dtype=np.float64)
    n, L, H = x.shape
    lo, hi = stats.rank_intervals(x.reshape(n, -1), resamples=resamples, level=level, seed=seed)
    return {
        "examples": int(n),
        "level": level,
        "tau_halves": stats.kendall_tau_halves(x.reshape(n, -1), seed=seed) if n >= 4 else None,
        "rank_low": np.asarray(lo).reshape(L, H),
        "rank_high": np.asarray(hi).reshape(L, H),
    }


def identity_of(loaded) -> Identity:
    from ..models.default import display_id

    return Identity(loaded.weights_sha256, display_id(loaded.model_id), loaded.arch.model_type, loaded.arch.num_layers, loaded.arch.num_heads)


# ----------------------------------------------------------------------------- methods


def pair_methods() -> tuple[str, ...]:
    """The head methods of ``attattr circuit`` that are tables on pairs: every one but those
    whose name is a table of this module (``attention``, ``random``: on pairs the table of that
    name is this module's), so that ``prune`` judges AtP or NAP-IG as it judges attribution."""
    from .circuits import REGISTRY

    return tuple(n for n in REGISTRY if n not in TABLES or "pairs" not in TABLES[n].tasks)


def methods_for(task: str) -> tuple[str, ...]:
    """Every registered method that gives a head table on ``task`` (store, data or pairs)."""
    own = tuple(m.name for m in TABLES.values() if task in m.tasks)
    return own + (pair_methods() if task == "pairs" else ())


def parse_methods(spec: str, task: str) -> list[str]:
    """``spec`` (a comma list, or ``all``) checked against the methods that fit ``task``."""
    names = [m.strip().lower() for m in spec.split(",") if m.strip()]
    allowed = methods_for(task)
    known = METHODS + tuple(n for n in pair_methods() if n not in METHODS)
    if not names:
        raise OptionError("methods (--methods) is empty; give one of " + ", ".join(allowed))
    if names == ["all"]:
        return list(allowed)
    for m in names:
        if m not in known:
            raise OptionError(f"unknown importance method '{m}'; available: {', '.join(known)}")
        if m not in allowed:
            needs = [INPUTS[t] for t in INPUTS if m in methods_for(t)]
            raise OptionError(f"method '{m}' needs {' or '.join(needs)}")
    return list(dict.fromkeys(names))


def circuit_tables(loaded, pairs, names: Sequence[str], metric: str, seed: int = 0, source: str = "",
                   progress: Progress | None = None) -> list[Table]:
    """One table per head method of the circuit registry (``names``) on ``pairs`` (data/pairs.py
    ``Pair``): each head's score averaged over the pairs, the ablation the counterfactual run
    (MIB's patching), heads as nodes; ``examples`` the pairs' indices."""
    from .circuits import REGISTRY
    from .circuits.task import CircuitTask, Context

    ctx = Context(CircuitTask(loaded, pairs, metric=metric), ablation="patching", seed=seed, progress=progress)
    tables = []
    for name in names:
        per = np.asarray(REGISTRY[name].compute(ctx), dtype=np.float64)
        tables.append(Table(name, name, per.mean(0), [p.index for p in pairs], None, source,
                            f"{REGISTRY[name].description} (attattr circuit's {name}, {metric}, over {len(pairs)} pairs)"))
    return tables


MASKABLE_FAMILIES = ("self", "encoder")


def store_family(store, family: str | None = None) -> str:
    """The attention family importance reads from ``store``: ``family`` if given, else the
    store's first. Head importance ranks heads attattr can mask and prune, so only
    self-attention (encoder-only and decoder-only models) and the encoder family of an
    encoder-decoder model are accepted."""
    have = store.families()
    name = family or (have[0] if have else "self")
    if have and name not in have:
        raise StoreError(f"{store.path} has no attention family '{name}'; it has: {', '.join(have)}")
    if name not in MASKABLE_FAMILIES:
        raise OptionError(
            f"head importance and pruning work on self-attention and encoder heads; the {name} family of an"
            " encoder-decoder model is not supported (use --family encoder)")
    return name


def from_store(store, methods: Sequence[str], examples: Sequence[int] | None = None,
               progress: Progress | None = None, family: str | None = None) -> tuple[Identity, list[Table]]:
    """attr / attention tables averaged over the store's examples (or the given indices),
    for one attention family (see :func:`store_family`)."""
    family = store_family(store, family)
    prov = store.provenance
    fp = store.fingerprint
    ident = Identity(str(fp.get("weights_sha256", prov.get("weights_sha256", ""))), str(prov.get("model", "")),
                     str(prov.get("model_type", "")), int(prov.get("num_layers", 0)), int(prov.get("num_heads", 0)))
    idx = store.indices() if examples is None else list(examples)
    if not idx:
        raise StoreError(f"{store.path} holds no complete example")
    have = set(store.indices())
    missing = [i for i in idx if i not in have]
    if missing:
        raise StoreError(f"example {missing[0]} is not in {store.path}")
    idx, skipped = store.finite(idx)
    if not idx:
        raise StoreError(f"every example asked for in {store.path} holds NaN or inf (flagged 'nonfinite'):"
                         " nothing to average")
    unconverged = len(store.unconverged(idx))
    each = head_values(store, idx, methods, ident.num_layers, ident.num_heads, family,
                       {"attr": "attribution importance", "attention": "the attention method"},
                       " (or use the attr method)", progress)
    desc = {
        "attr": "E_x[max_ij Attr_h(A)] (signed max), from the store's head_max",
        "attention": "E_x[max_ij A_h]: the attention-score baseline",
    }
    tables = [Table(m, m, each[m].sum(0) / len(idx), list(idx), None, str(store.path), desc[m],
                    skipped_nonfinite=skipped, unconverged=unconverged if m == "attr" else 0,
                    stability=stability(each[m])) for m in methods]
    return ident, tables


def head_values(store, idx: Sequence[int], methods: Sequence[str], L: int, H: int, family: str,
                needs: dict[str, str], hint: str = "", progress: Progress | None = None) -> dict[str, np.ndarray]:
    """Per example float64 [len(idx), layer, head] of each of ``methods``: ``attr`` the stored
    head_max, ``attention`` :func:`attention_max`. Raises StoreError where an example lacks a
    layer (attr) or the per-head maps (attention); ``needs[method]`` names who needs them in
    the message, ``hint`` ends the one about maps."""
    each = {m: np.zeros((len(idx), L, H), np.float64) for m in methods}
    for k, i in enumerate(idx):
        e = store.get(i, arrays="attention" in methods, family=family)
        if "attr" in methods:
            if list(e.layers) != list(range(L)):
                raise StoreError(f"{store.path} scored layers {e.layers}; {needs['attr']} needs every layer"
                                 " (score them all)")
            each["attr"][k] = e.head_max
        if "attention" in methods:
            if e.attention is None or np.ndim(e.attention) != 4:
                raise StoreError(
                    f"{store.path} keeps no per-head attention maps (scored with keep sum or none);"
                    f" {needs['attention']} needs them: score with keep maps{hint}")
            each["attention"][k] = attention_max(e, L, H)
        if progress:
            progress(k + 1, len(idx), f"example {i}")
    return each


def attention_max(e, L: int, H: int) -> np.ndarray:
    """max_ij A_h(i, j) of one store example [layer, head]. A language model's queries are the
    positions whose next token is attributed (the first row of a causal map attends only to
    itself, so its maximum is 1 in every head and cannot rank them)."""
    a = np.asarray(e.attention, np.float64)
    lm = e.meta.get("lm") if isinstance(e.meta, dict) else None
    if isinstance(lm, dict) and lm.get("positions"):
        a = a[:, :, [int(p) for p in lm["positions"]], :]
    return a.reshape(L, H, -1).max(-1)


def taylor(loaded, examples: Sequence[Example], label_map: Sequence[int] | None = None, batch_size: int = 32,
           normalize: bool = True, truncate: bool = False, progress: Progress | None = None) -> Table:
    """Michel et al.'s head importance: E_x |dL/d gate_h| with L the cross-entropy of the gold label."""
    from ..engine.heads import Batches

    batches = Batches(loaded, examples, label_map, batch_size, truncate)

    def loss(b) -> torch.Tensor:
        logits = loaded.model(**b.inputs).logits.float()
        target = torch.where(b.gold >= 0, b.gold, logits.argmax(-1))
        return torch.nn.functional.cross_entropy(logits, target, reduction="sum")

    total = _gate_gradients(loaded, batches.batches, batches.device, lambda b: b.inputs["input_ids"].shape[0], loss,
                            progress)
    return _taylor_table(total, batches.n, normalize, [e.index for e in examples],
                         "E_x|sum A_h * dL/dA_h| (Michel et al. 2019), L = cross-entropy of the gold label")


def _gate_gradients(loaded, batches, device, rows, objective, progress: Progress | None) -> torch.Tensor:
    """Per head, |d objective(b) / d gate_h| summed over the rows of every batch b (``rows(b)``
    of them), with a gate of 1 on every head's output of every row."""
    from ..engine.heads import masked

    L, H = loaded.arch.num_layers, loaded.arch.num_heads
    total = torch.zeros(L, H, dtype=torch.float64)
    for k, b in enumerate(batches):
        gate = torch.ones(rows(b), L, H, device=device, requires_grad=True)
        with torch.enable_grad(), masked(loaded.model, gate):
            (g,) = torch.autograd.grad(objective(b), gate)
        total += g.detach().abs().double().sum(0).cpu()
        if progress:
            progress(k + 1, len(batches), "")
    return total


def _taylor_table(total: torch.Tensor, n: int, normalize: bool, examples: list, description: str) -> Table:
    """The Taylor table from the per-head sum of |gate gradients| over ``n`` examples: their
    mean, with ``normalize`` of unit L2 norm per layer."""
    values = total / max(n, 1)
    if normalize:
        norm = values.norm(dim=1, keepdim=True)
        values = values / torch.where(norm > 0, norm, torch.ones_like(norm))
    return Table("taylor", "taylor", values.numpy(), examples, None, "",
                 description + (", L2-normalised per layer" if normalize else ""))


def taylor_pairs(loaded, batches, normalize: bool = True, progress: Progress | None = None) -> Table:
    """Michel et al.'s importance for clean / counterfactual pairs of a language model
    (analysis/prune.py ``PairBatches``): I_h = E_x |d m_x / d gate_h| with m_x the pair's
    metric (the logit difference answer - foil by default) in place of the loss."""
    from ..models.arch import last_logits_only

    task = batches.task

    def metric(b) -> torch.Tensor:
        extra = last_logits_only(b.clean.shape[1], task.device) if task.last_only else {}
        logits = loaded.model(input_ids=b.clean, use_cache=False, **extra).logits[:, -1].float()
        return task.metric(logits, b).sum()

    total = _gate_gradients(loaded, task.batches, task.device, lambda b: b.size, metric, progress)
    return _taylor_table(total, batches.n, normalize, [],
                         f"E_x|d m_x / d gate_h| (Michel et al. 2019), m the pair metric {batches.metric}")


def random_table(num_layers: int, num_heads: int, seed: int) -> Table:
    gen = np.random.default_rng(seed)
    return Table(f"random-{seed}", "random", gen.random((num_layers, num_heads)), [], seed, "",
                 f"uniform random order, seed {seed}")


# ----------------------------------------------------------------------------- the file


@dataclass
class ImportanceFile:
    path: str
    identity: Identity
    tables: dict[str, Table]

    def groups(self) -> dict[str, list[Table]]:
        """Tables by method, in file order (random-0, random-1, ... together)."""
        out: dict[str, list[Table]] = {}
        for t in self.tables.values():
            out.setdefault(t.method, []).append(t)
        return out


def _a(obj, key, default=None):
    v = obj.attrs.get(key, default)
    return v.decode() if isinstance(v, bytes) else v


def read(path: str | os.PathLike) -> ImportanceFile:
    p = Path(path)
    if not p.exists():
        raise StoreError(f"no such importance file: {p}")
    try:
        f = h5py.File(p, "r")
    except OSError as exc:
        raise StoreError(f"{p} is not an HDF5 importance file (attattr importance writes one)") from exc
    with f:
        if _a(f, "schema") != SCHEMA:
            raise StoreError(f"{p} is not an attattr importance file (schema '{_a(f, 'schema')}'; "
                             "make one with attattr importance)")
        ver = str(_a(f, "schema_version", "0"))
        if int(ver.split(".")[0]) > SCHEMA_MAJOR:
            raise StoreError(f"{p} has importance schema {ver}, newer than this attattr reads ({SCHEMA_VERSION}); upgrade attattr")
        ident = Identity(str(_a(f, "weights_sha256")), str(_a(f, "model")), str(_a(f, "model_type")),
                         int(_a(f, "num_layers")), int(_a(f, "num_heads")))
        tables = {}
        for name in f.get("methods", {}):
            d = f["methods"][name]
            values = d[()]
            if values.shape != (ident.num_layers, ident.num_heads):
                raise StoreError(f"{p}: table '{name}' has shape {values.shape}, the file's model "
                                 f"{ident.num_layers} x {ident.num_heads}")
            ex = f["examples"][name][()].tolist() if "examples" in f and name in f["examples"] else []
            seed = _a(d, "seed", -1)
            stab = None
            if "rank_low" in d.attrs:
                tau = float(d.attrs.get("tau_halves", np.nan))
                stab = {"examples": len(ex), "level": float(d.attrs.get("rank_level", 0.95)),
                        "tau_halves": tau if np.isfinite(tau) else None,
                        "rank_low": np.asarray(d.attrs["rank_low"]), "rank_high": np.asarray(d.attrs["rank_high"])}
            tables[name] = Table(name, str(_a(d, "method", name)), values, ex, None if seed is None or int(seed) < 0 else int(seed),
                                 str(_a(d, "source", "")), str(_a(d, "description", "")), stability=stab)
    return ImportanceFile(str(p), ident, tables)


def write(path: str | os.PathLike, identity: Identity, tables: Sequence[Table], command: Sequence[str] = ()) -> ImportanceFile:
    """Add (or replace) tables in ``path``; an existing file must be for the same model.

    Written to a temporary file beside ``path`` and renamed over it, so the old file is
    intact until the new one is complete.
    """
    p = Path(path)
    merged: dict[str, Table] = {}
    if p.is_file() and not is_stream(p):  # a device or a FIFO (/dev/null) holds no earlier tables
        old = read(p)
        if old.identity.weights_sha256 != identity.weights_sha256 or \
                (old.identity.num_layers, old.identity.num_heads) != (identity.num_layers, identity.num_heads):
            raise StoreError(f"{p} holds importance for another model, {old.identity.describe()}; "
                             f"this run is for {identity.describe()}; choose another output file")
        merged.update(old.tables)
    for t in tables:
        if t.values.shape != (identity.num_layers, identity.num_heads):
            raise StoreError(f"table '{t.name}' has shape {t.values.shape}, the model {identity.num_layers} x {identity.num_heads}")
        merged[t.name] = t
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    with replaced(p) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs.update({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "attattr_version": __version__,
                            "created": now, "weights_sha256": identity.weights_sha256, "model": identity.model,
                            "model_type": identity.model_type, "num_layers": identity.num_layers,
                            "num_heads": identity.num_heads, "command": strict_dumps(list(command))})
            gm, ge = f.create_group("methods"), f.create_group("examples")
            for t in merged.values():
                d = gm.create_dataset(t.name, data=np.asarray(t.values, np.float64))
                d.dims[0].label, d.dims[1].label = "layer", "head"
                d.attrs.update({"method": t.method, "seed": -1 if t.seed is None else int(t.seed),
                                "source": t.source, "n_examples": len(t.examples), "description": t.description})
                if t.stability is not None:
                    tau = t.stability.get("tau_halves")
                    d.attrs.update({"tau_halves": np.nan if tau is None else float(tau),
                                    "rank_low": np.asarray(t.stability["rank_low"], np.float64),
                                    "rank_high": np.asarray(t.stability["rank_high"], np.float64),
                                    "rank_level": float(t.stability.get("level", 0.95))})
                ge.create_dataset(t.name, data=np.asarray(t.examples, np.int64))
    return ImportanceFile(str(p), identity, merged)


def check_model(imp: ImportanceFile, loaded) -> None:
    """Refuse an importance file made for another model or another shape."""
    here = identity_of(loaded)
    there = imp.identity
    if (there.num_layers, there.num_heads) != (here.num_layers, here.num_heads):
        raise StoreError(f"{imp.path} is for a model with {there.num_layers} layers x {there.num_heads} heads; "
                         f"the model given has {here.num_layers} x {here.num_heads}")
    if there.weights_sha256 != here.weights_sha256:
        raise StoreError(f"{imp.path} was computed for another model, {there.describe()}; the model given is "
                         f"{here.describe()}")


