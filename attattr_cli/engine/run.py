"""A scoring run: model + data + options -> store, resumable. No printing here."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..data.types import Example
from ..errors import DataError, OptionError
from ..models.loading import LoadedModel, load
from ..store import StoreWriter
from ..store.writer import already_done
from . import grouped
from .generation import StepwiseScorer
from .encoding import unknown_words
from .options import ScoreOptions
from .provenance import libraries
from .scorer import Scorer

Progress = Callable[[int, int, str], None]


@dataclass
class ScoreRequest:
    out: str
    model: str | None = None
    data: str | None = None
    task: str | None = None
    examples: str | None = None
    options: ScoreOptions = field(default_factory=ScoreOptions)
    device: str = "auto"
    store_dtype: str = "float32"
    seed: int = 0
    command: list[str] = field(default_factory=lambda: list(sys.argv))
    prompts: list[str] | None = None  # --lm: prompts given on the command line (instead of --data)
    inputs: list[Example] | None = None  # examples given in memory (the Python API) instead of data/task rows
    label_names: list[str] | None = None  # the model's label names when it is already loaded (no config to read)


@dataclass
class ScoreReport:
    out: str
    scored: int
    skipped: int
    total: int
    created: bool
    kernel: str
    model: str
    mean_abs_residual: float | None
    accuracy: float | None
    notes: list[str] = field(default_factory=list)  # e.g. a store repaired by copying (one line each)
    nonfinite: int = 0  # examples scored with NaN or inf somewhere, flagged in the store


def resolve_inputs(model: str | None, data: str | None, task_name: str | None, label_names: list[str] | None = None):
    """Decide model id, task and examples from the user's three options.

    No model and no data: the built-in default (synthetic task, shipped model).
    ``label_names``: the model's, when it is already loaded (else read from its config).
    """
    from ..data import get_task, load_examples, resolve_model_for_task
    from ..models.default import DEFAULT_MODEL_DIR

    if model is None and data is None and task_name is None:
        task_name = "synthetic"
    task = get_task(task_name) if task_name is not None else None
    if task is not None and task.name == "synthetic" and model is None:
        model = str(DEFAULT_MODEL_DIR)
    if label_names is None:
        label_names = _config_labels(model) if task is None and model is not None else None
    try:
        examples, labels = load_examples(data, task, label_names)
    except DataError as exc:
        if data is None and model is None and task is not None and task.default_model:
            raise DataError(
                f"{exc}, and --model with a local folder of a model fine-tuned for {task.name} "
                f"(the preset's default, {task.default_model}, also comes from the hub)"
            ) from exc
        raise
    if model is None:
        preset = resolve_model_for_task(task, None) if task is not None else None
        if preset is None or data is not None:  # never reach for a hub model the user did not name
            hint = f" (the {task.name} preset is {preset}: --model {preset} uses it)" if preset else ""
            raise OptionError(f"data needs a model (--data needs --model): a local model folder or a hub id{hint}")
        model = preset
    return model, task, examples, labels


def resolve_lm_inputs(model: str | None, data: str | None, prompts: list[str] | None):
    """Model id and prompts of a language-model run: --prompt texts, or the text column(s)
    of --data (a pair becomes one prompt, the two texts joined by a space)."""
    from ..data import load_examples

    if model is None:
        raise OptionError("--lm needs --model: a local causal language model folder (or a hub id in the local cache)")
    if prompts and data:
        raise OptionError("give --prompt or --data, not both")
    if prompts:
        return model, [Example(i, p) for i, p in enumerate(prompts)]
    if data is None:
        raise OptionError("--lm needs --prompt TEXT (or --data with a text column)")
    from ..data import pairs

    if pairs.is_pairs_file(data):  # clean / counterfactual pairs: each example keeps its own answer and foil
        return model, pairs.as_examples(pairs.read_pairs(data))
    examples, _ = load_examples(data, None, None)
    return model, [Example(e.index, e.text_a if e.text_b is None else f"{e.text_a} {e.text_b}", meta=dict(e.meta))
                   for e in examples]


def _config_labels(model: str) -> list[str] | None:
    """The model's label names from its config (cheap: no weights), for data without a task."""
    from transformers import AutoConfig

    try:
        cfg = AutoConfig.from_pretrained(model)
    except (OSError, ValueError):
        return None  # the model load reports the problem
    return [str(cfg.id2label[i]) for i in range(cfg.num_labels)]


def data_digest(examples: list[Example]) -> str:
    h = hashlib.sha256()
    for e in examples:
        row = [e.index, e.text_a, e.text_b, e.label]
        if isinstance(e.meta, dict) and "pair" in e.meta:  # a pair's answer and foil are part of its data
            row.append(e.meta["pair"])
        h.update(json.dumps(row, ensure_ascii=False, sort_keys=True).encode())
    return h.hexdigest()


@dataclass
class PreparedRun:
    """Everything a run needs before it writes: the model, the scorer, the chosen examples
    (encoded), and what the store records. Built by :func:`prepare_run`."""

    req: ScoreRequest
    loaded: LoadedModel
    scorer: Scorer
    picked: list[Example]
    encoded: dict[int, object]
    fingerprint: dict
    provenance: dict
    notes: list = field(default_factory=list)  # one line each, for stderr (examples asked for that do not exist)

    def tokens(self) -> dict[int, int]:
        """Token count of every chosen example (the work it costs grows with it)."""
        return {i: len(e.input_ids) for i, e in self.encoded.items()}


def scorer_for(loaded: LoadedModel, options: ScoreOptions, task_labels=None) -> Scorer:
    """The scoring strategy, chosen once: a generation step by step (engine/generation.py),
    else one example at a time, or in groups where the model allows (engine/grouped.py,
    per group in ``score_into``)."""
    kind = StepwiseScorer if options.stepwise else Scorer
    return kind(loaded, options, task_labels=task_labels)


def prepare_run(req: ScoreRequest, loaded: LoadedModel | None = None) -> PreparedRun:
    """Load the model and data, choose and encode the examples, and compute the fingerprint.

    Nothing is written. An input that is too long fails here.
    """
    from ..data import parse_examples
    from ..models.default import DEFAULT_MODEL_DIR, display_id, is_builtin

    torch.manual_seed(req.seed)
    if req.inputs is not None:
        from ..data import get_task

        if req.data is not None or req.prompts:
            raise OptionError("give examples in memory or a data file, not both")
        task = get_task(req.task) if req.task is not None else None
        labels = None if req.options.lm or task is None else list(task.labels)
        examples = list(req.inputs)
        if loaded is not None:
            model_id = req.model or loaded.model_id
        elif req.model is not None:
            model_id = req.model
        elif req.options.lm:
            raise OptionError("a language model is needed: pass model")
        else:
            model_id = str(DEFAULT_MODEL_DIR)
    elif req.options.lm:
        if req.task is not None:
            raise OptionError("--task presets are classification tasks; with --lm give --prompt or --data")
        model_id, examples = resolve_lm_inputs(req.model, req.data, req.prompts)
        task, labels = None, None
    else:
        if req.prompts:
            raise OptionError("--prompt goes with --lm (a causal language model)")
        model_id, task, examples, labels = resolve_inputs(req.model, req.data, req.task, req.label_names)
    chosen = parse_examples(req.examples, len(examples))
    from ..data.select import beyond

    missing = beyond(req.examples, len(examples))
    notes = [f"examples {missing[0]}..{missing[-1]} do not exist ({len(missing)} asked for beyond the"
             f" {len(examples)} the data has); scoring the {len(chosen)} that do"] if missing else []
    if loaded is None:
        loaded = load(model_id, device=req.device, dtype=req.options.dtype, lm=req.options.lm)
    scorer = scorer_for(loaded, req.options, task_labels=labels)
    picked = [examples[i] for i in chosen]
    builtin_model = is_builtin(model_id)
    if builtin_model:
        loaded.model_id = display_id(model_id)
    fingerprint = {  # the model is identified by its weights, wherever it was loaded from
        "weights_sha256": loaded.weights_sha256,
        "options": req.options.fingerprint(loaded.arch.num_layers),
        "data": f"{task.name if task else ('lm' if req.options.lm else 'generic')}:"
                f"{req.data or ('prompt' if req.prompts else 'memory' if req.inputs is not None else 'builtin')}",
        "data_sha256": data_digest(examples),
    }
    provenance = {
        "model": loaded.model_id,
        "model_path": model_id,
        "model_source": "builtin" if builtin_model else loaded.source,
        "model_revision": loaded.revision or "",
        "weights_sha256": loaded.weights_sha256,
        "model_type": loaded.arch.model_type,
        "model_class": type(loaded.model).__name__,
        "num_layers": loaded.arch.num_layers,
        "num_heads": loaded.arch.num_heads,
        "families": {f.name: {"layers": f.num_layers, "heads": f.num_heads, "query": f.query_side,
                              "key": f.key_side, "scored": f.name in scorer.layers_of,
                              "not_attention": {str(i): kind for i, kind in f.not_attention}}
                     for f in loaded.arch.families},
        "lm": bool(req.options.lm),
        "max_length": loaded.arch.max_length or 0,
        "label_names": [] if req.options.lm else loaded.label_names,
        "task": task.name if task else "",
        "task_labels": list(labels or []),
        "label_mapping": scorer.label_how,
        "data": req.data or ("memory" if req.inputs is not None else "builtin"),
        "data_sha256": fingerprint["data_sha256"],
        "options": asdict(req.options),
        "libraries": libraries(),
        "seed": req.seed,
        "device": str(scorer.device),
        "dtype": req.options.dtype,
        "kernel": scorer.backend.name,
        "command": req.command,
        "store_dtype": req.store_dtype,
    }
    # encode everything first: an input that is too long fails before anything is written
    encoded = {e.index: scorer.encode(e) for e in picked}
    return PreparedRun(req, loaded, scorer, picked, encoded, fingerprint, provenance, notes)


def writes_behind(device: torch.device) -> bool:
    """Whether the store writes each example on a thread of its own while the next is scored
    (store/writer.py, ``behind``): on a CUDA device, where compressing and writing the maps
    takes as long as scoring them; ``ATTATTR_WRITE_BEHIND=1`` / ``0`` decides anywhere."""
    chosen = os.environ.get("ATTATTR_WRITE_BEHIND", "").strip()
    return chosen == "1" if chosen in ("0", "1") else device.type == "cuda"


def score_into(prep: PreparedRun, out: str | None = None, indices: list[int] | None = None,
               progress: Progress | None = None, shard: str = "", run_info: dict | None = None) -> ScoreReport:
    """Score the prepared examples (or those of ``indices`` among them) into ``out``
    (default ``prep.req.out``), skipping those already there.

    ``shard`` ("k/n") marks a store written by one of n processes; its ``indices`` are then
    recorded as the shard's assignment, so that a merge can tell a finished shard from an
    interrupted one.
    """
    req, scorer = prep.req, prep.scorer
    out = req.out if out is None else out
    wanted = None if indices is None else set(indices)
    picked = [e for e in prep.picked if wanted is None or e.index in wanted]
    assigned = [e.index for e in picked] if shard else None
    if not shard:  # nothing to do: succeed without opening the store for writing (it may be read-only)
        have = already_done(out, prep.fingerprint, req.store_dtype)
        if have is not None and all(e.index in have for e in picked):
            return ScoreReport(str(Path(out)), 0, len(picked), len(picked), False, scorer.backend.name,
                               prep.loaded.model_id, mean_abs_residual=None, accuracy=None, notes=list(prep.notes))
    with StoreWriter(out, prep.fingerprint, prep.provenance, store_dtype=req.store_dtype,
                     shard=shard, assigned=assigned, behind=writes_behind(scorer.device)) as writer:
        todo = [e for e in picked if e.index not in writer.done]
        writer.log_run({
            "command": req.command, "kernel": scorer.backend.name, "device": str(scorer.device),
            "requested": len(picked), "to_score": len(todo), **(run_info or {}),
        })
        total = len(todo) * sum(len(v) for v in scorer.layers_of.values())
        done_units = 0
        resid, right, golds, flagged = [], 0, 0, 0
        if progress:
            progress(0, total, "scoring")
        # short examples of encoder classifiers share passes (engine/grouped.py); each is
        # written as soon as its group is done, so a group is the most an interruption loses
        for group in grouped.plan_groups(todo, prep.encoded, grouped.group_size(scorer)):
            def tick(position, _layer, _group=group):
                nonlocal done_units
                done_units += 1
                if progress:
                    progress(done_units, total, f"example {_group[position].index}")

            results = grouped.score_group(scorer, group, [prep.encoded[e.index] for e in group], on_layer=tick)
            for result in results:
                writer.write(result)
                if result.nonfinite:
                    flagged += 1
                    continue
                resid.extend(abs(float(r)) for r in result.residual)
                if result.gold >= 0:
                    golds += 1
                    right += int(result.gold == result.pred)
        created = writer.created
        notes = list(prep.notes) + list(writer.notes) + scorer.graph_notes()
    return ScoreReport(str(Path(out)), len(todo), len(picked) - len(todo), len(picked), created, scorer.backend.name,
                       prep.loaded.model_id, mean_abs_residual=(sum(resid) / len(resid)) if resid else None,
                       accuracy=(right / golds) if golds else None, notes=notes, nonfinite=flagged)


def score_to_store(req: ScoreRequest, progress: Progress | None = None,
                   loaded: LoadedModel | None = None, warn: Callable[[str], None] | None = None,
                   notify: Callable[[str], None] | None = None) -> ScoreReport:
    """Score the requested examples into ``req.out``, skipping those already there.

    ``warn`` receives the one-time notice of the out-of-memory back-off (default: warnings.warn);
    ``notify`` the estimate of peak memory and store size said before a long run
    (engine/budget.py), which is refused (ResourceError) where it would exceed ``--memory``.
    """
    from . import budget, memory, threads

    prep = prepare_run(req, loaded)
    lines, _budget = budget.check(prep.scorer, prep.encoded, req.options.memory, req.store_dtype)
    # the tokens one pass holds: the longest example's, times the short examples a group scores together
    longest = max(prep.tokens().values(), default=0) * max(1, min(grouped.group_size(prep.scorer), len(prep.picked)))
    count = threads.choose(longest, req.options.threads, memory.hidden_size(prep.scorer.model.config))
    if notify is not None:
        for line in lines:
            notify(f"{line}; {count} thread{'s' if count != 1 else ''}")
    with threads.using(count):
        return _score_prepared(prep, progress, warn)


def _score_prepared(prep: PreparedRun, progress: Progress | None, warn) -> ScoreReport:
    prep.scorer.warn = warn
    unknown = unknown_words(prep.scorer.tokenizer, prep.encoded, prep.loaded.model_id)
    hybrid = prep.scorer.arch.hybrid_note  # a hybrid's layers without softmax attention: said once
    for note in (unknown, hybrid):
        if not note:
            continue
        if warn is not None:
            warn(note)
        else:
            from ..errors import warn_user

            warn_user(note)  # at the caller of score()
    return score_into(prep, progress=progress)
