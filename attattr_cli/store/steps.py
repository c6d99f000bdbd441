"""A generation's per-step results in a store: one group ``steps/TTTTT`` per generated token,
its family's datasets cropped to its prefix (schema 1.4; the layout is docs/store.md, "Schema
1.4"). The reader gives each step as a StoredExample of its prefix (``StoredExample.steps``).
"""

from __future__ import annotations

import dataclasses

import h5py
import numpy as np

from .family import damaged, family_arrays, read_family, write_family
from .opening import read_attr
from .schema import STEPS


def step_name(step: int) -> str:
    return f"{step:05d}"


def write_steps(g, steps, held: list, store_dtype: str = "float32") -> None:
    """Every step of ``steps`` (engine.generation.StepScore) into ``g/steps``; the groups and
    datasets made are added to ``held`` (store/family.py ``write_family``)."""
    parent = g.create_group(STEPS)
    held.append(parent)
    for st in steps:
        where = parent.create_group(step_name(st.step))
        held.append(where)
        arrays = family_arrays(st.family)
        arrays["attention"] = arrays["attention_mean"] = None
        write_family(where, arrays, held, store_dtype)
        a = where.attrs
        a["step"], a["position"], a["target"], a["pred"] = int(st.step), int(st.position), int(st.target), int(st.pred)
        a["target_token"] = str(st.target_token)
        if (st.extra or {}).get("pred_token") is not None:
            a["pred_token"] = str(st.extra["pred_token"])
        a["f_full"], a["logit"], a["prob"] = float(st.f_full), float(st.logit), float(st.prob)
        a["foil"] = -1 if st.foil is None else int(st.foil)
        a["keep"] = st.family.keep
        a["n_tokens"] = int(st.position) + 1
    g.attrs["steps"] = len(steps)


def read_steps(path, example, g, arrays: bool = True) -> list | None:
    """The steps of the example group ``g`` as StoredExamples of their prefixes (None: not a
    step-by-step generation, or a store before schema 1.4); each step's datasets are checked
    as an example's are (store/family.py ``read_family``)."""
    if STEPS not in g:
        return None
    where = f"example {example.index}"
    parent = g[STEPS]
    if not isinstance(parent, h5py.Group):
        raise damaged(path, where, f"'{STEPS}' is a dataset, not the group of the generation's steps")
    names = sorted(parent)
    count = read_attr(g, "steps")
    if not isinstance(count, int) or isinstance(count, bool) or count < 0:
        count = len(names)  # no count recorded: the steps must still run 0, 1, 2, ... without a gap
    expected = [step_name(t) for t in range(count)]
    if names != expected:  # a step deleted (or added): never read as a shorter whole generation
        missing = [str(int(x)) for x in expected if x not in parent]
        extra = [x for x in names if x not in expected]
        raise damaged(path, where, f"its generation has {count} steps, but "
                      + (f"step{'s' if len(missing) != 1 else ''} {', '.join(missing[:5])} "
                         f"{'are' if len(missing) != 1 else 'is'} missing" if missing
                         else f"'{STEPS}' holds {', '.join(extra[:5])} besides them"))
    out = []
    for name in names:
        sg = parent[name]
        here = f"{where}, step {int(name)}"
        if not isinstance(sg, h5py.Group):
            raise damaged(path, here, "the step is a dataset, not a group")
        a = sg.attrs
        for key in ("step", "position", "target", "pred", "n_tokens", "foil", "f_full", "logit", "prob"):
            value = read_attr(sg, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise damaged(path, here, f"its attribute '{key}' is {value!r}, not a number")
        n = int(read_attr(sg, "n_tokens"))
        if not 0 < n <= len(example.tokens):
            raise damaged(path, here, f"it was scored on {n} tokens, but the example holds {len(example.tokens)}")
        fam = read_family(path, sg, here, arrays)
        for key in ("attribution", "head_sum"):  # maps over the step's prefix, one per layer
            if key in sg and sg[key].size and sg[key].shape[-2:] != (n, n):
                raise damaged(path, here, f"'{key}' has the shape {sg[key].shape}, not maps of {n} x {n} tokens")
        meta = dict(example.meta)
        t = int(a["step"])
        meta["step"] = {"step": t, "of": count, "position": int(a["position"]), "target_token": str(a["target_token"]),
                        "foil": int(a["foil"]), "logit": float(a["logit"]), "prob": float(a["prob"])}
        meta["lm"] = _step_lm(example, a, t)
        out.append(dataclasses.replace(
            example, tokens=list(example.tokens[:n]), input_ids=np.asarray(example.input_ids)[:n],
            segment_ids=np.asarray(example.segment_ids)[:n], pred=int(a["pred"]), target=int(a["target"]),
            logits=np.asarray([float(a["logit"])]), probs=np.asarray([float(a["prob"])]),
            f_full=float(a["f_full"]), keep=str(a["keep"]), key_tokens=list(example.tokens[:n]),
            meta=meta, steps=None,
            **dict(fam, attention=None if example.attention is None else np.asarray(example.attention)[..., :n, :n])))
    return out


def _step_lm(example, a, t: int) -> dict:
    """The step's own ``meta["lm"]``: its position, target, prediction and foil probability
    (the example's holds those of the whole generation)."""
    lm = dict(example.meta.get("lm") or {}) if isinstance(example.meta, dict) else {}
    pred, target = int(a["pred"]), int(a["target"])
    if "pred_token" in a:
        pred_token = str(a["pred_token"])
    elif pred == target:
        pred_token = str(a["target_token"])
    else:  # stores before the step's predicted piece was kept: a token of the sequence, or the id
        ids = [int(x) for x in np.asarray(example.input_ids).ravel()]
        pred_token = str(example.tokens[ids.index(pred)]) if pred in ids else f"<id {pred}>"
    lm.update(positions=[int(a["position"])], target_ids=[target], target_tokens=[str(a["target_token"])],
              predicted_id=pred, predicted_token=pred_token)
    for key in ("foil_probs", "foil_logits"):
        if lm.get(key) is not None:
            values = list(lm[key])
            lm[key] = [values[t]] if t < len(values) else []
    return lm
