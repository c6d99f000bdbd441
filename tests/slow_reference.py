"""The slow, paper-exact attribution: the procedure of the 2021 reference code.

For target layer l it runs the whole model at batch m (every layer, every step), with
layer l's attention probabilities replaced by alpha_k * A (A from a clean forward) as
a tensor that requires grad, takes dF/dP for the full [m, heads, n, n] probabilities,
and returns A * sum_k w_k dF/dP_k. Nothing of the fast algebra is used. Lives in tests/
only; bench/ imports it to time the 2021 procedure.
"""

from __future__ import annotations

import contextvars

import torch
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, eager_mask

_state: contextvars.ContextVar = contextvars.ContextVar("slow_ref", default=None)


def _attn(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    st = _state.get()
    heads = query.shape[1]
    if key.shape[1] != heads:
        key = key.repeat_interleave(heads // key.shape[1], dim=1)
        value = value.repeat_interleave(heads // value.shape[1], dim=1)
    mask = attention_mask
    if mask is None and getattr(module, "is_causal", False) and query.shape[-2] > 1:
        n = query.shape[-2]
        dev = query.device
        mask = torch.zeros(n, n, dtype=query.dtype, device=dev).masked_fill(
            ~torch.ones(n, n, dtype=torch.bool, device=dev).tril(), torch.finfo(query.dtype).min)[None, None]
    scale = query.shape[-1] ** -0.5 if scaling is None else scaling
    scores = torch.matmul(query, key.transpose(-1, -2)) * scale
    if mask is not None:
        scores = scores + mask
    probs = torch.softmax(scores, dim=-1)
    layer = st["owner"].get(id(module))
    if layer is None:
        pass
    elif st["mode"] == "record":
        st["probs"][layer] = probs.detach()
    elif layer == st["layer"]:
        base = st["probs"][layer]
        probs = (st["alphas"].view(-1, 1, 1, 1).to(device=base.device, dtype=base.dtype) * base).requires_grad_(True)
        st["leaf"] = probs
    return torch.matmul(probs, value).transpose(1, 2).contiguous(), probs


AttentionInterface.register("attattr_slow_reference", _attn)
AttentionMaskInterface.register("attattr_slow_reference", eager_mask)


def _owner(model):
    """id(module) -> (family, layer): the architecture facts (which attention call is
    which), nothing of the fast algebra."""
    from attattr_cli.models.arch import attention_module, find_families

    owner = {}
    for name, _path, attn, layers in sorted(find_families(model), key=lambda f: f[2] is not None):
        for i, layer in enumerate(layers):
            for sub in attention_module(layer, attn).modules():
                owner[id(sub)] = (name, i)
    return owner


def slow_attribution(model, inputs: dict, layers, alphas, weights, target: int, output: str = "prob",
                     pad_to: int | None = None, with_baseline: bool = True, f_of_logits=None,
                     more_inputs: dict | None = None, family: str | None = None,
                     step_batch: int | None = None):
    """Return {layer: Attr [heads, n, n]} (float64 if the model is) and {layer: F(alpha=0)}.

    ``family`` picks the attention family of encoder-decoder models (encoder, decoder,
    cross; default: the first). ``f_of_logits`` maps the model's logits to F per batch row
    (language-model targets); ``more_inputs`` holds more model inputs (use_cache, logits_to_keep).
    ``step_batch`` runs the steps in batches of that many (the 2021 code's batch_size);
    default: all steps in one batch.

    ``with_baseline`` adds alpha = 0 as one more row (weight 0) to read F(0) for the
    completeness check; the 2021 code had no such row (the benchmark turns it off).
    ``inputs`` holds batch-1 tensors (input_ids, maybe token_type_ids). With ``pad_to``,
    the input is right-padded to that length with an attention mask, as the 2021 code did
    (max_seq_length 128), and the result is cut back to the real length.
    """
    n = inputs["input_ids"].shape[1]
    inputs = dict(inputs)
    if pad_to is not None and pad_to > n:
        pad = pad_to - n
        inputs = {k: torch.nn.functional.pad(v, (0, pad), value=0) for k, v in inputs.items()}
        inputs["attention_mask"] = torch.cat([torch.ones(1, n, dtype=torch.long),
                                              torch.zeros(1, pad, dtype=torch.long)], dim=1)
    more = dict(more_inputs or {})
    owner = _owner(model)
    if family is None:
        family = sorted(set(owner.values()))[0][0] if len({f for f, _ in owner.values()}) == 1 else "encoder"
    owner = {k: (v[1] if v[0] == family else None) for k, v in owner.items()}
    old = model.config._attn_implementation
    old_pad = model.config.pad_token_id
    model.config._attn_implementation = "attattr_slow_reference"
    if old_pad is None:  # decoder classifiers refuse batches > 1 without a pad token
        model.config.pad_token_id = -1
    try:
        st = {"mode": "record", "probs": {}, "owner": owner, "layer": None}
        tok = _state.set(st)
        try:
            with torch.no_grad():
                model(**inputs, **more)
            result, f0s = {}, {}
            for layer in layers:
                extra = 1 if with_baseline else 0
                alist = torch.cat([torch.as_tensor(alphas, dtype=torch.float64), torch.zeros(extra, dtype=torch.float64)])
                wlist = torch.cat([torch.as_tensor(weights, dtype=torch.float64), torch.zeros(extra, dtype=torch.float64)])
                chunk = step_batch or len(alist)
                grad = None
                for start in range(0, len(alist), chunk):  # the 2021 code's batches of steps
                    a_part, w_part = alist[start:start + chunk], wlist[start:start + chunk]
                    st.update(mode="attr", layer=layer, alphas=a_part, leaf=None)
                    batch = {k: v.expand(len(a_part), -1) for k, v in inputs.items()}
                    with torch.enable_grad():
                        logits = model(**batch, **more).logits
                        work = logits.double() if logits.dtype != torch.float64 else logits
                        if f_of_logits is not None:
                            f = f_of_logits(work)
                        else:
                            f = work[:, target] if output == "logit" else torch.softmax(work, -1)[:, target]
                        (g,) = torch.autograd.grad((f * w_part.to(f.device)).sum(), st["leaf"])
                    grad = g.sum(0) if grad is None else grad + g.sum(0)
                    del g, logits, work
                a = st["probs"][layer][0]
                attr = a * grad
                result[layer] = attr[:, :n, :n]
                f0s[layer] = float(f[-1].detach()) if with_baseline else float("nan")
        finally:
            _state.reset(tok)
    finally:
        model.config._attn_implementation = old
        model.config.pad_token_id = old_pad
    return result, f0s
