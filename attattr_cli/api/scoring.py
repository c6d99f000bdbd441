"""``score``: attention attribution into results in memory or a store."""

from __future__ import annotations

import tempfile
from pathlib import Path

from ..engine.options import MAX_NODES
from ..errors import OptionError
from .inputs import _check_min, _cmd, _default_task, _model_arg, _spec, to_examples
from .model import Model, as_model, progress_for, using
from .results import read_all


# ----------------------------------------------------------------------------- score


def score(model=None, inputs=None, *, data=None, task=None, examples=None, out=None, steps: int | None = None,
          rule: str | None = None, tol: float | None = None, max_nodes: int = MAX_NODES, target: str = "predicted",
          output: str = "prob", layers=None, steps_per_pass: int | None = None, group: int | None = None, family=None, keep: str = "auto", top_k: int | None = None,
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
    each head's k strongest entries; ``steps_per_pass`` bounds the steps run at once and
    ``group`` the short examples scored together (default 32 for encoder classifiers, up to 64 for narrow ones; 1: one
    at a time); the numbers do not depend on either (up to float rounding). Integration:
    ``tol`` (the default, 0.1, when neither ``steps`` nor ``rule`` is given) is error-controlled
    (adaptive subdivision of the path per example and layer until the map's estimated error
    is below tol x max |Attr| of the layer and the completeness residual agrees, at most
    ``max_nodes`` nodes; each result's ``convergence`` says per layer whether it did); ``rule`` and/or
    ``steps`` choose a fixed rule instead (``rule="right", steps=20`` is the paper's,
    ``"left"`` the 2021 code's); see docs/integration.md. Results in memory hold exactly what a store written with the
    same options would (float32 arrays, or float16 with ``store_dtype``). A causal language model (``load_model(..., lm=True)``)
    attributes the next token (``target_token``) or a ``continuation``.
    """
    from ..engine.run import ScoreRequest, score_to_store
    from ..engine.options import KEEPS, OUTPUTS, ScoreOptions, integration

    _check_min("steps", steps)
    _check_min("steps_per_pass", steps_per_pass)
    _check_min("group", group)
    _check_min("max_nodes", max_nodes, 5)
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
        if target_token is not None or continuation is not None or position is not None:
            raise OptionError("target_token, continuation and position go with a causal language model"
                              " (load_model(..., lm=True))")
        task = _default_task(model_id, data, task, exs)
    elif target not in ("predicted",):
        raise OptionError(f"target '{target}' names a class; a language model's target is the predicted next token,"
                          " target_token or continuation")
    options = ScoreOptions(**integration(steps, rule, tol), max_nodes=max_nodes, group=group, target=target,
                           output=output,
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
