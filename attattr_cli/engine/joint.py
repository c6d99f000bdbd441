"""The joint path (``--path joint``; docs/method.md section 1.6): every scored layer's attention
scaled together, one integral for the whole model.

The paper's path scales one layer's map, A_l(alpha) = alpha A_l with every other layer clean,
and needs an integral per layer. The joint path puts a gate gamma on every entry of every
scored layer's attention at once (the model computes gamma * A from its live A) and integrates
along the diagonal gamma = alpha 1:

    Attr_l = integral_0^1 A_l(alpha) * (dF/dO_l(alpha) V_l(alpha)^T) d alpha

where A_l(alpha), V_l(alpha) are layer l's live attention and values at that point (the layers
below are scaled too) and dF/dO_l its output's gradient. This is integrated gradients over the
gates (Sundararajan et al. 2017), so completeness holds for the whole model:
sum_l sum Attr_l = F(A) - F(every scored layer's attention 0). With one scored layer it is the
paper's path exactly. A node is one forward and one backward of the whole model whatever the
number of layers: L scored layers cost the passes of one, against about L / 2 full passes per
node for the per-layer path (a target layer's pass runs the layers at and above it).

What differs from the per-layer path: a layer's share is measured while the other layers are
scaled too, and there is no per-layer completeness (the store's per-layer ``residual`` is
NaN; the whole model's is in the example's ``meta["path"]``); the per-head maxima exist only
where the per-head maps are kept (``--keep maps``; NaN otherwise).

Nodes: a fixed rule (``--steps``/``--rule``, its embedded estimate as for the per-layer path),
or with ``--tol`` nested Clenshaw-Curtis levels (3, 5, 9, 17, ... nodes, each reusing the
last's), stopping when every layer's kept numbers moved by at most tol x their largest from
the level below and the whole model's completeness residual is at most tol x |F(A) - F(0)|.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .. import convergence
from ..ops import reference, reference_mask, with_causal
from . import attention
from .integrate import clenshaw_curtis

FLOOR = 16  # the residual test allows FLOOR x machine epsilon of |F(1)| + |F(0)| (as engine/adaptive.py)
ROW_TOKENS = 2048  # tokens per pass on CPU: nodes of a short input share a pass
TYPICAL_NODES = 9  # the third Clenshaw-Curtis level: what engine/budget.py counts a joint integral holding


def _probs(s: dict, dtype: torch.dtype) -> torch.Tensor:
    """A site's live attention [rows, head, q, k] from its saved projections."""
    mask = reference_mask(s["mask"])
    mask = with_causal(mask, s["q"], s["k"]) if s["causal"] else mask
    return reference.attention_probs(s["q"].to(dtype), s["k"].to(dtype), mask, s["scale"], s["softcap"])


def kept_of(attr: torch.Tensor, keep: str) -> torch.Tensor:
    """What ``keep`` keeps of maps [rows, head, q, k]: the maps, the head sum [rows, q, k] or
    the per-key sums [rows, k]."""
    if keep == "maps":
        return attr
    if keep == "sum":
        return attr.sum(1)
    return attr.sum((1, 2))


class JointPath:
    """The joint integral of one example: :meth:`run` returns per site the kept numbers and
    the convergence, and F at 0."""

    def __init__(self, sc, enc, target, sites: list, keep: str):
        self.sc, self.enc, self.target, self.sites, self.keep = sc, enc, target, list(sites), keep
        self.acc = torch.float64 if sc.dtype == torch.float64 else torch.float32
        self.q: dict = {}  # alpha -> {site: kept [..]} (float64 for key sums, acc otherwise)
        self.f: dict = {}  # alpha -> F
        self.slope: dict = {}  # alpha -> dF/dalpha = sum over sites of sum Attr
        self.passes = 0

    # -- nodes --------------------------------------------------------------------------
    def _evaluate(self, alphas: list[float]) -> None:
        """F, dF/dalpha and every site's kept numbers at ``alphas`` (new ones only)."""
        todo = [a for a in alphas if a not in self.f]
        n = max(len(self.enc.input_ids), len(self.enc.decoder_input_ids or []))
        per = max(1, ROW_TOKENS // max(n, 1)) if self.sc.device.type == "cpu" else len(todo)
        for start in range(0, len(todo), per):
            part = todo[start:start + per]
            self._pass(part)

    def _pass(self, alphas: list[float]) -> None:
        sc = self.sc
        plan = attention.Joint(torch.tensor(alphas, dtype=torch.float64, device=sc.device), frozenset(self.sites))
        with attention.active(plan), torch.enable_grad():
            logits = sc._logits(self.enc, len(alphas))
            f = sc._target_value(logits, self.target)
            missing = [s for s in self.sites if s not in plan.leaves]
            if missing:
                raise attention.not_routed(sc.arch.model_type, *missing[0])
            grads = torch.autograd.grad(f.sum(), [plan.leaves[s] for s in self.sites])
        self.passes += 1
        f = f.detach().double().cpu().tolist()
        slope = [0.0] * len(alphas)
        out = [{} for _ in alphas]
        for site, g in zip(self.sites, grads):
            s = plan.saved[site]
            a = _probs(s, self.acc)
            attr = a * torch.matmul(g.to(self.acc), s["v"].to(self.acc).transpose(-1, -2))
            del a
            sums = attr.sum((1, 2, 3), dtype=torch.float64).cpu().tolist()
            kept = kept_of(attr, self.keep)
            kept = kept.double() if self.keep == "sources" else kept
            for r in range(len(alphas)):
                slope[r] += sums[r]
                out[r][site] = kept[r].detach().cpu().clone()
            del attr, kept
        for r, alpha in enumerate(alphas):
            self.f[alpha], self.slope[alpha], self.q[alpha] = f[r], slope[r], out[r]

    def _rule(self, alphas: np.ndarray, weights: np.ndarray) -> dict:
        """{site: sum_k w_k kept_k} (the nodes evaluated)."""
        total = {}
        for alpha, w in zip(alphas.tolist(), weights.tolist()):
            for site, kept in self.q[alpha].items():
                part = kept * w
                total[site] = part if site not in total else total[site] + part
        return total

    def _residual(self, alphas, weights) -> float:
        return float(sum(w * self.slope[a] for a, w in zip(alphas.tolist(), weights.tolist()))) \
            - (self.f[1.0] - self.f[0.0])

    # -- the integral ---------------------------------------------------------------------
    def run(self) -> tuple[dict, dict, float, dict]:
        """({site: kept}, {site: (nodes, error, capped, state)}, F(0), meta)."""
        sc = self.sc
        tol = sc.options.tol
        eps_f = float(torch.finfo(sc.dtype).eps)
        if tol is None:
            alphas, weights = sc.alphas.numpy(), sc.weights.numpy()
            nodes = sorted(set(alphas.tolist()) | {0.0, 1.0})  # F(0) and F(1) for the residual
            self._evaluate(nodes)
            total = self._rule(alphas, weights)
            if sc.low is not None:
                low = self._rule(alphas, sc.low[0])
                errors = {s: _relative(total[s], low[s]) / sc.low[1] for s in self.sites}
            else:
                errors = {s: float("nan") for s in self.sites}
            resid = self._residual(alphas, weights)
            tol_check = sc.check_tol
            r_ok = self._residual_ok(resid, tol_check, eps_f)
            states = {s: convergence.CONVERGED if r_ok and not (errors[s] > tol_check) else
                      (convergence.RESIDUAL if not r_ok else convergence.ESTIMATE) for s in self.sites}
            conv = {s: (len(alphas), errors[s], False, states[s]) for s in self.sites}
            return total, conv, self.f[0.0], self._meta(resid, len(alphas), all(v == 0 for v in states.values()))
        level, prev = 1, None
        cap = max(3, sc.options.max_nodes)
        while True:
            alphas, weights = clenshaw_curtis(2 ** level)
            self._evaluate(alphas.tolist())
            total = self._rule(alphas, weights)
            if prev is None:  # the level below the first: the trapezoid rule on alpha = 0, 1
                prev = self._rule(np.array([0.0, 1.0]), np.array([0.5, 0.5]))
            errors = {s: _relative(total[s], prev[s]) for s in self.sites}
            resid = self._residual(alphas, weights)
            e_ok = all(e <= tol for e in errors.values())
            r_ok = self._residual_ok(resid, tol, eps_f)
            capped = 2 ** (level + 1) + 1 > cap
            if (e_ok and r_ok) or capped:
                break
            prev, level = total, level + 1
        states = {s: convergence.CONVERGED if (errors[s] <= tol and r_ok) else
                  (convergence.RESIDUAL if errors[s] <= tol else convergence.CAP_HIT) for s in self.sites}
        conv = {s: (len(alphas), errors[s], capped and not (e_ok and r_ok), states[s]) for s in self.sites}
        return total, conv, self.f[0.0], self._meta(resid, len(alphas), e_ok and r_ok)

    def _residual_ok(self, resid: float, tol: float, eps_f: float) -> bool:
        effect = self.f[1.0] - self.f[0.0]
        scale = abs(self.f[1.0]) + abs(self.f[0.0])
        return abs(resid) <= tol * abs(effect) + FLOOR * eps_f * scale

    def _meta(self, resid: float, nodes: int, converged: bool) -> dict:
        return {"name": "joint", "f_zero": self.f[0.0], "f_full": self.f[1.0], "residual": resid, "nodes": nodes,
                "passes": self.passes, "converged": bool(converged)}


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |a| (0 where both are 0)."""
    big = float(a.abs().max()) if a.numel() else 0.0
    diff = float((a - b).abs().max()) if a.numel() else 0.0
    if big > 0:
        return diff / big
    return 0.0 if diff == 0 else math.inf


def layer_result(sc, keep: str, total: dict, conv: dict, f0: float, site, heads: int) -> dict:
    """One site's entry as the per-layer path's ``Assembly._layer_result`` makes it."""
    from .assembly import top_entries

    kept = total[site]
    maps = kept.float() if keep == "maps" else None
    return {
        "map": maps,
        "sum": maps.sum(0) if maps is not None else (kept.float() if keep == "sum" else None),
        "topk": None if sc.options.top_k is None or maps is None else top_entries(maps, sc.options.top_k),
        "key_sum": kept.float() if keep == "sources" else None,
        "head_max": maps.flatten(1).amax(-1) if maps is not None else torch.full((heads,), float("nan")),
        "f0": f0,
        "resid": float("nan"),
        "conv": conv[site],
    }
