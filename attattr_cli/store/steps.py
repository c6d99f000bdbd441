"""A generation's per-step results in a store (schema 1.4; docs/store.md).

An example scored step by step (``--generate``, ``--continuation --per-step``) holds one group
``steps/TTTTT`` per generated token: the datasets of its family (cropped to its prefix, the
position + 1 tokens it was scored on; no ``attention``, the example's holds it) and the
attributes ``step``, ``position``, ``target``, ``target_token``, ``pred``, ``f_full``,
``logit``, ``prob``, ``foil`` (-1: none), ``keep`` and ``n_tokens``. The reader gives each step as a
:class:`~attattr_cli.store.reader.StoredExample` of its prefix (``StoredExample.steps``).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .opening import read_attr
from .schema import STEPS


def step_name(step: int) -> str:
    return f"{step:05d}"


def write_steps(writer, g, steps) -> None:
    """Every step of ``steps`` (engine.generation.StepScore) into ``g/steps``."""
    from .writer import family_arrays

    parent = g.create_group(STEPS)
    writer._held.append(parent)
    for st in steps:
        where = parent.create_group(step_name(st.step))
        writer._held.append(where)
        arrays = family_arrays(st.family)
        arrays["attention"] = arrays["attention_mean"] = None
        writer._write_family(where, arrays)
        a = where.attrs
        a["step"], a["position"], a["target"], a["pred"] = int(st.step), int(st.position), int(st.target), int(st.pred)
        a["target_token"] = str(st.target_token)
        a["f_full"], a["logit"], a["prob"] = float(st.f_full), float(st.logit), float(st.prob)
        a["foil"] = -1 if st.foil is None else int(st.foil)
        a["keep"] = st.family.keep
        a["n_tokens"] = int(st.position) + 1
    g.attrs["steps"] = len(steps)


def read_steps(example, g, arrays: bool = True) -> list | None:
    """The steps of the example group ``g`` as StoredExamples of their prefixes (None: not a
    step-by-step generation, or a store before schema 1.4)."""
    if STEPS not in g:
        return None
    out = []
    for name in sorted(g[STEPS]):
        sg = g[STEPS][name]
        a = sg.attrs
        n = int(read_attr(sg, "n_tokens"))

        def arr(key, big=True):
            if key not in sg:
                return None
            return sg[key][()] if (arrays or not big) else None

        conv = arr("convergence", big=False)
        meta = dict(example.meta)
        meta["step"] = {"step": int(a["step"]), "position": int(a["position"]), "target_token": str(a["target_token"]),
                        "foil": int(a["foil"]), "logit": float(a["logit"]), "prob": float(a["prob"])}
        out.append(dataclasses.replace(
            example, tokens=list(example.tokens[:n]), input_ids=np.asarray(example.input_ids)[:n],
            segment_ids=np.asarray(example.segment_ids)[:n], pred=int(a["pred"]), target=int(a["target"]),
            logits=np.asarray([float(a["logit"])]), probs=np.asarray([float(a["prob"])]),
            layers=[int(x) for x in sg["layers"][()]], attribution=arr("attribution"),
            attention=None if example.attention is None else np.asarray(example.attention)[..., :n, :n],
            head_max=sg["head_max"][()], f_full=float(a["f_full"]), f_baseline=sg["f_baseline"][()],
            residual=sg["residual"][()], keep=str(a["keep"]), head_sum=arr("head_sum"),
            topk_index=arr("topk_index"), topk_value=arr("topk_value"),
            key_tokens=list(example.tokens[:n]), nodes=arr("nodes", big=False),
            error_estimate=arr("error_estimate", big=False),
            node_cap_hit=None if "node_cap_hit" not in sg else sg["node_cap_hit"][()].astype(bool),
            convergence=conv if conv is None else conv.astype(np.uint8),
            convergence_tol=float(sg["convergence"].attrs["tol"]) if "convergence" in sg else None,
            meta=meta, steps=None, key_sum=arr("key_sum", big=False)))
    return out


def generation_summary(examples) -> dict | None:
    """What ``attattr info`` says of the generations among ``examples`` (StoredExamples read
    with their steps): how many, their steps, the largest per-step completeness residual
    and the per-step convergence (None when no example is a generation)."""
    from .. import convergence

    gens = [e for e in examples if e.steps]
    if not gens:
        return None
    resid, states, unconverged = [], [], []
    for e in gens:
        for t, st in enumerate(e.steps):
            resid.extend(np.abs(st.residual).tolist())
            states.extend(np.asarray(st.convergence).tolist() if st.convergence is not None else [])
            unconverged.extend({"example": int(e.index), "step": t, "layer": layer, "state": why}
                               for layer, why in convergence.unconverged_layers(st.layers, st.convergence).items())
    counts = [len(e.steps) for e in gens]
    return {"examples": len(gens), "steps_total": int(sum(counts)), "steps_max": int(max(counts)),
            "step_abs_residual_max": float(max(resid)) if resid else None,
            "step_abs_residual_mean": float(np.mean(resid)) if resid else None,
            "step_convergence": convergence.counts(states), "step_layers_unconverged": len(unconverged),
            "step_unconverged_at": unconverged[:100]}
