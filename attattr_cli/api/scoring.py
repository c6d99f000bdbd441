"""``score``: attention attribution into results in memory or a store."""

from __future__ import annotations

from pathlib import Path

# the option values and defaults (torch-free), which `attattr score`'s help shows; cli_words: its messages' words
from ..engine.options import DEFAULT_TOL, MAX_NODES, RULES, SOURCES_RULE, SOURCES_STEPS, cli_words  # noqa: F401
from ..errors import OptionError
from .checks import OneOf, Examples, File, Inputs, Ints, Names, Out, Progress, Str, Texts, checked
from .groups import Compute, Group, Hooks, Integration, Target, legacy_table, regroup
from .inputs import command_of, default_task, model_arg, pairs_given, selection, to_examples
from .model import Model, ModelArg, as_model, progress_for, using
from .results import TemporaryStore, read_all


SCORE_GROUPS = {"target": Target, "integration": Integration, "compute": Compute, "hooks": Hooks}
# score's old flat keywords (each a field of its group, under its own name), kept for one release; but
# target, an argument still (a text is the class: Target.target)
SCORE_LEGACY = {k: v for k, v in legacy_table(SCORE_GROUPS).items() if k != "target"}
TARGET = OneOf(Group(Target), Str(), what="an aa.Target, or the class: predicted, gold, a label name or index")


@checked(model=ModelArg(), inputs=Inputs(), data=File(), task=Str(), examples=Examples(), prompts=Texts(), out=Out(),
         layers=Ints(), family=Names(), target=TARGET, integration=Group(Integration), compute=Group(Compute),
         hooks=Group(Hooks), progress=Progress(), command=Texts())
def score(model=None, inputs=None, *, data=None, task=None, examples=None, prompts=None, lm: bool | None = None,
          out=None, layers=None, family=None, keep: str = "auto", top_k: int | None = None, sources: str | None = None,
          target=None, integration=None, compute=None, hooks=None, seed: int = 0, progress=False, command=None,
          **legacy):
    """Attention attribution of every layer and head (docs/api.md, "Scoring", says every option).

    ``inputs``: texts, (premise, hypothesis) pairs, ``Example`` or clean / counterfactual ``Pair``
    objects; or ``data`` (a TSV, CSV or JSONL file, or a JSONL of pairs) and/or ``task`` (a preset
    such as ``sst2``), with ``examples`` ("0:100", or a list of indices); with none of them the
    built-in synthetic held-out set. ``prompts`` (texts for a causal LM, ``lm=True``) may stand for
    ``inputs``, or with ``out`` for ``data``.

    Without ``out`` returns :class:`Results` (one :class:`Attribution` per example, in order: what a
    store written with the same options would hold). With ``out`` writes (or resumes) the HDF5 store
    and returns the run's ``ScoreReport`` (``.out``, ``.scored``, ``.skipped``, ``.mean_abs_residual``,
    ``.accuracy``); under torchrun every process scores its share into a shard that rank 0 merges, and
    the report is the run's ``DistReport``. `attattr score` is this call.

    Kept: ``layers`` (default all), ``family`` (attention families, e.g. encoder,cross), ``keep``
    (auto, maps, sum, sources or none), ``top_k`` (also each head's k strongest entries), ``sources``
    (an LM prompt's keys grouped into "sentences", "paragraphs" or the passages of a JSONL
    ``FILE[:FIELD]``; docs/long-context.md). The other options are the fields of ``target``
    (:class:`Target`; a text is the class alone), ``integration`` (:class:`Integration`), ``compute``
    (:class:`Compute`) and ``hooks`` (:class:`Hooks`); ``seed`` seeds ``Target.sample``. Those fields as
    flat keywords (``steps=20``) still work for one release, with a FutureWarning.

    Raises OptionError for a bad or contradictory option (with a model given by path, before it
    loads), DataError for bad data, ResourceError for a run whose estimated peak exceeds
    ``Compute.memory`` (naming the ``keep`` that fits)."""
    g = regroup("score", {"target": target, "integration": integration, "compute": compute, "hooks": hooks},
                legacy, SCORE_LEGACY, SCORE_GROUPS, shorthand={"target": lambda text: Target(target=text)})
    t, i, c, h = g["target"], g["integration"], g["compute"], g["hooks"]
    from ..engine.budget import parse_size
    from ..engine.options import ScoreOptions, integration as resolve_integration, precheck

    if isinstance(family, str):
        family = [f.strip() for f in family.split(",") if f.strip()]
    metric = _pair_metric(t.metric, data, inputs)

    def options_for(is_lm):
        return ScoreOptions(**resolve_integration(i.steps, i.rule, i.tol, sources), max_nodes=i.max_nodes,
                            group=c.group, target=t.target, output=t.output, layers=layers, dtype=c.dtype,
                            truncate=c.truncate, step_batch=c.steps_per_pass, kernel=c.kernel, family=family,
                            keep=keep, top_k=top_k, lm=is_lm, target_token=t.target_token,
                            continuation=t.continuation, position=t.position, foil=t.foil, generate=t.generate,
                            per_step=t.per_step, sample_seed=seed if t.sample else None, metric=metric,
                            sources=None if sources is None else str(sources), memory=parse_size(c.memory),
                            threads=c.threads)

    # the options, the selection, the output and the data file are checked before anything loads
    if out is not None:
        from ..fileio import check_output, check_store_output

        check_store_output(out, "out")
        check_output(out, [data, model if isinstance(model, (str, Path)) else None], "out")
    precheck(options_for(bool(lm) or (isinstance(model, Model) and model.loaded.lm)), selection(examples), data)
    from ..engine.run import ScoreRequest, score_to_store

    if out is not None and inputs is None and (model is None or isinstance(model, (str, Path))):
        return _score_store(ScoreRequest(
            out=str(out), model=None if model is None else str(model), data=None if data is None else str(data),
            task=task, examples=selection(examples), options=options_for(bool(lm)), device=c.device, seed=seed,
            store_dtype=c.store_dtype, command=command_of(command), prompts=list(prompts) if prompts else None),
            progress, h.warn, c.keep_shards, c.dist_timeout, h.notify)
    if prompts:  # results in memory: the prompts are the inputs
        if inputs is not None:
            raise OptionError("give prompts or inputs, not both")
        inputs = list(prompts)

    if model is not None and not isinstance(model, (str, Path)):
        model = as_model(model, lm=bool(lm))  # once: wrapping a (model, tokenizer) pair hashes its weights
    is_lm = bool(lm) or (isinstance(model, Model) and model.loaded.lm)
    exs = to_examples(inputs) if inputs is not None else None
    model_id, names = model_arg(model)
    if not is_lm:
        if t.target_token is not None or t.continuation is not None or t.position is not None \
                or t.generate is not None or t.per_step:
            raise OptionError("target_token, continuation, position, generate and per_step go with a causal language model"
                              " (load_model(..., lm=True))")
        task = default_task(model_id, data, task, exs)
    elif t.target not in ("predicted",):
        raise OptionError(f"target '{t.target}' names a class; a language model's target is the predicted next token,"
                          " target_token or continuation")
    options = options_for(is_lm)
    tmp = None
    path = out
    if out is None:
        tmp = TemporaryStore("attattr-score-")
        path = tmp.path
    try:
        with using(model, device=c.device, dtype=c.dtype, lm=is_lm) as m, progress_for(progress, "score") as bar:
            req = ScoreRequest(out=str(path), model=model_id, data=data, task=task, examples=selection(examples),
                               options=options, device=c.device, store_dtype=c.store_dtype, seed=seed,
                               command=command_of(command), inputs=exs, label_names=names)
            report = score_to_store(req, progress=bar, loaded=m.loaded, warn=h.warn, notify=h.notify)
            if out is not None:
                return report
            res = read_all(path, m.label_names)
            for e in res:  # the store stays while an example lives: save() copies from it
                e.backing_file = tmp
            res.backing_file, tmp = tmp, None
            return res
    finally:
        if tmp is not None:
            tmp.remove()


def _pair_metric(metric, data, inputs):
    """The metric of a run: as given, or ``logit-diff`` for pairs (a pairs JSONL or Pair inputs)."""
    pairs = pairs_given(data, inputs)
    if metric is None:
        return "logit-diff" if pairs else None
    if not pairs:
        raise OptionError("--metric goes with clean / counterfactual pairs (a JSONL of prompt, counterfactual,"
                          " answer, foil; or Pair inputs)")
    return metric


def _score_store(req, progress, warn, keep_shards: bool, timeout: float, notify=None):
    """A run into a store from a request: this process alone, or its share under torchrun."""
    from ..engine import distributed
    from ..engine.run import score_to_store

    env = distributed.detect()
    if env is not None and env.world_size > 1:
        with progress_for(progress if env.rank == 0 else None, f"score rank 0/{env.world_size}") as bar:
            return distributed.score_distributed(req, env, progress=bar, warn=warn, keep_shards=keep_shards,
                                                 timeout=timeout)
    with progress_for(progress, "score") as bar:
        return score_to_store(req, progress=bar, warn=warn, notify=notify)
