"""Adversarial attention (Jain & Wallace 2019, section 4.2), and what attention attribution
does under it. In one layer the pooled row of every head, a_h = A_h[pool, :], is replaced by
a'_h searched (projected gradient ascent, restarts in one batch) to maximise the mean over
heads of JSD(a_h, a'_h) subject to TVD(p(a'), p(a)) <= epsilon; then the layer's attention
attribution (``ATTR_STEPS`` midpoint steps) under the clean and the adversarial attention
are compared as the two attentions are (JSD of the pooled row's head-summed maps, Kendall
tau-b over the content tokens). JSD in natural logarithms (at most ln 2). The search, its
step and the comparison: docs/faithfulness.md, "Adversarial attention".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import OptionError
from .stats import kendall_tau_b

EPSILONS = (0.01, 0.05)
ATTR_STEPS = 20


@dataclass
class AdversarialOptions:
    epsilons: tuple = EPSILONS
    layer: int = -1
    restarts: int = 4
    iterations: int = 100
    step: float = 0.2  # initial step (largest change of one attention weight)
    attr_steps: int = ATTR_STEPS
    seed: int = 0

    def validate(self) -> None:
        if not self.epsilons:
            raise OptionError("--epsilons: give at least one value")
        for e in self.epsilons:
            if not 0 < e < 1:
                raise OptionError(f"--epsilons are total variation distances in (0, 1), got {e}")
        if self.restarts < 1 or self.iterations < 1:
            raise OptionError("adversarial search: restarts and iterations must be 1 or more")


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of every row (last axis) onto the probability simplex."""
    n = v.shape[-1]
    u, _ = torch.sort(v, dim=-1, descending=True)
    css = u.cumsum(-1) - 1.0
    k = torch.arange(1, n + 1, dtype=v.dtype, device=v.device)
    rho = ((u - css / k) > 0).sum(-1, keepdim=True).clamp_min(1)
    theta = css.gather(-1, rho - 1) / rho.to(v.dtype)
    return (v - theta).clamp_min(0.0)


def jsd(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Jensen-Shannon divergence (natural log) along the last axis."""
    m = 0.5 * (p + q)

    def kl(a, b):
        return torch.where(a > 0, a * (torch.log(a.clamp_min(1e-300)) - torch.log(b.clamp_min(1e-300))),
                           torch.zeros_like(a)).sum(-1)

    return 0.5 * kl(p, m) + 0.5 * kl(q, m)


def jsd_np(p, q) -> float:
    return float(jsd(torch.as_tensor(np.asarray(p, dtype=np.float64)), torch.as_tensor(np.asarray(q, dtype=np.float64))))


class _Site:
    """One example's edited layer: the clean attention, the clean output, and forwards with
    the pooled rows replaced (layers below replayed)."""

    def __init__(self, runner, ex, layer: int):
        from ..engine import attention
        from ..models.arch import find_layers
        from .token_importance import model_inputs

        self.runner = runner
        self.ex = ex
        self.model = runner.model
        if runner.loaded.arch.is_encoder_decoder:
            raise OptionError("adversarial attention runs on encoder-only and decoder-only classifiers, "
                              f"not on {runner.loaded.arch.model_type}")
        _, self.layers = find_layers(self.model)
        num = len(self.layers)
        if not -num <= layer < num:
            raise OptionError(f"layer {layer} does not exist: the model has {num} layers (0..{num - 1})")
        self.layer = layer % num
        self.clean_inputs = model_inputs([ex], runner.device)
        record = attention.Record()
        captured = {}
        hook = None
        if self.layer > 0:
            hook = self.layers[self.layer - 1].register_forward_hook(lambda m, i, o: captured.setdefault("out", o))
        try:
            with attention.taken_over(self.model), torch.no_grad(), attention.active(record):
                logits = self.model(**self._inputs(1)).logits
        finally:
            if hook is not None:
                hook.remove()
        runner.forwards += 1
        self.replay = captured.get("out")
        self.attention = record.probs[("self", self.layer)][0].double()  # [H, n, n]
        self.p0 = torch.softmax(logits[0].double(), -1)

    def _inputs(self, b):
        return {k: v.expand(b, -1) for k, v in self.clean_inputs.items()}

    def logits(self, full: torch.Tensor) -> torch.Tensor:
        """Logits [b, C] with the layer's attention replaced by ``full`` [b, H, n, n]."""
        from ..engine import attention
        from .attention_edit import Edit, edited

        b = full.shape[0]
        with edited(self.model, Edit(self.layer, lambda p: full.to(p.dtype))), \
                attention.replayed_below(self.layers, self.layer, self.replay, b):
            out = self.model(**self._inputs(b)).logits
        self.runner.forwards += b
        return out.double()

    def with_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """[b, H, n, n]: the clean attention with the pooled rows replaced by ``rows`` [b, H, n]."""
        b = rows.shape[0]
        full = self.attention.expand(b, *self.attention.shape).clone()
        full[:, :, self.ex.pool, :] = rows
        return full

    def target(self, logits: torch.Tensor) -> torch.Tensor:
        work = logits if self.runner.output == "logit" else torch.softmax(logits, -1)
        return work[:, self.ex.target]

    def attribution(self, full: torch.Tensor, steps: int) -> torch.Tensor:
        """Attr [H, n, n] of attention ``full`` [H, n, n]: full * mean_k dF(alpha_k full)/dA,
        alpha_k = (k - 1/2) / steps."""
        alphas = (torch.arange(steps, dtype=torch.float64) + 0.5) / steps
        leaf = (alphas.view(-1, 1, 1, 1) * full.detach()[None]).requires_grad_(True)
        with torch.enable_grad():
            f = self.target(self.logits(leaf)).sum()
            (g,) = torch.autograd.grad(f, leaf)
        return full.detach() * g.mean(0)


def search(site: _Site, epsilon: float, opts: AdversarialOptions, generator: torch.Generator) -> dict:
    """The feasible pooled rows [H, n] of largest mean JSD, with what was reached."""
    a = site.attention[:, site.ex.pool, :]  # [H, n]
    heads, n = a.shape
    r = opts.restarts
    # restart 0 starts near the clean rows, the others part way to random rows
    noise = -torch.log(torch.rand(r, heads, n, generator=generator, dtype=torch.float64))
    noise = noise / noise.sum(-1, keepdim=True)  # uniform on the simplex (Dirichlet(1, ..., 1))
    mix = torch.linspace(0.05, 1.0, r, dtype=torch.float64).view(r, 1, 1)
    x = (1 - mix) * a[None] + mix * noise
    feasible = a[None].expand(r, heads, n).clone()
    best = {"jsd": 0.0, "rows": a.clone(), "tvd": 0.0, "step": 0}
    for it in range(1, opts.iterations + 1):
        x = x.detach().requires_grad_(True)
        with torch.enable_grad():
            p = torch.softmax(site.logits(site.with_rows(x)), -1)
            tvd = 0.5 * (p - site.p0[None]).abs().sum(-1)  # [r]
            div = jsd(a[None].expand_as(x), x).mean(-1)  # [r]
            obj = div - torch.relu(tvd - 0.5 * epsilon) / epsilon
            (g,) = torch.autograd.grad(obj.sum(), x)
        tvd_v, div_v = tvd.detach(), div.detach()
        ok = tvd_v <= epsilon
        for i in torch.nonzero(ok).flatten().tolist():
            if div_v[i] > best["jsd"]:
                best = {"jsd": float(div_v[i]), "rows": x[i].detach().clone(), "tvd": float(tvd_v[i]), "step": it}
        feasible = torch.where(ok.view(r, 1, 1), x.detach(), feasible)
        size = opts.step * (1.0 - (it - 1) / opts.iterations) + 1e-3
        scale = g.abs().amax(-1, keepdim=True).clamp_min(1e-12)
        stepped = project_simplex(x.detach() + size * g / scale)
        back = 0.5 * (x.detach() + feasible)
        x = torch.where(ok.view(r, 1, 1), stepped, back)
    return best


def adversarial_example(runner, ex, opts: AdversarialOptions) -> dict:
    """Per epsilon: the max JSD of attention reached, the TVD of the output, the steps used,
    and how far attention attribution moved."""
    site = _Site(runner, ex, opts.layer)
    gen = torch.Generator().manual_seed(int(opts.seed) * 1_000_003 + int(ex.index))
    pool = ex.pool
    content = np.asarray(ex.content)
    attr0 = site.attribution(site.attention, opts.attr_steps)
    att_tok0 = site.attention[:, pool].mean(0).numpy()
    attr_tok0 = attr0[:, pool].sum(0).numpy()
    out = {"index": int(ex.index), "layer": site.layer, "epsilons": {}}
    for eps in opts.epsilons:
        best = search(site, float(eps), opts, gen)
        rows = best["rows"]
        full = site.attention.clone()
        full[:, pool] = rows
        attr1 = site.attribution(full, opts.attr_steps)
        att_tok1 = rows.mean(0).numpy()
        attr_tok1 = attr1[:, pool].sum(0).numpy()
        out["epsilons"][f"{eps:g}"] = {
            "jsd_attention": best["jsd"],  # mean over heads, Jain & Wallace's number
            "jsd_attention_tokens": jsd_np(att_tok0, att_tok1),
            "jsd_attribution_tokens": jsd_np(_dist(attr_tok0), _dist(attr_tok1)),
            "tau_attention": kendall_tau_b(att_tok0[content], att_tok1[content]),
            "tau_attribution": kendall_tau_b(attr_tok0[content], attr_tok1[content]),
            "tvd_output": best["tvd"],
            "steps": best["step"],
        }
    return out


def _dist(v: np.ndarray) -> np.ndarray:
    a = np.abs(np.asarray(v, dtype=np.float64))
    s = a.sum()
    return a / s if s > 0 else np.full(len(a), 1.0 / len(a))


ADV_METRICS = ("jsd_attention", "jsd_attention_tokens", "jsd_attribution_tokens", "tau_attention",
               "tau_attribution", "tvd_output", "steps")


def summarise(rows: list[dict], epsilons, seed: int = 0) -> dict:
    """Per epsilon: mean, median and 95 % bootstrap interval of every number; the paired
    test that attribution moved less than attention (JSD of the token maps, and tau)."""
    from . import stats

    out = {}
    for eps in epsilons:
        key = f"{eps:g}"
        entry = {}
        for metric in ADV_METRICS:
            v = [r["epsilons"][key][metric] for r in rows]
            v = [float(x) for x in v if x is not None and math.isfinite(x)]
            ci = stats.mean_ci(v, seed=seed)
            entry[metric] = {"mean": float(np.mean(v)) if v else None, "median": float(np.median(v)) if v else None,
                             "low": ci["low"], "high": ci["high"], "n": len(v)}
        js_att = [r["epsilons"][key]["jsd_attention_tokens"] for r in rows]
        js_attr = [r["epsilons"][key]["jsd_attribution_tokens"] for r in rows]
        t_att = [r["epsilons"][key]["tau_attention"] for r in rows]
        t_attr = [r["epsilons"][key]["tau_attribution"] for r in rows]
        keep = [i for i in range(len(rows)) if all(x is not None and math.isfinite(x) for x in (t_att[i], t_attr[i]))]
        entry["attribution_moved_less"] = {
            "jsd": stats.paired_test(js_attr, js_att, "less", seed=seed),
            "tau": stats.paired_test([t_attr[i] for i in keep], [t_att[i] for i in keep], "greater", seed=seed),
        }
        out[key] = entry
    return out
