"""Pure-PyTorch attention and attribution ops: the source of truth and the CPU path.

Shapes (TransformerLens style):
    q:    [batch, head, query_pos, d_head]
    k, v: [batch, head, key_pos, d_head]   (already repeated for grouped-query attention)
    mask: additive float mask broadcastable to [batch, head, query_pos, key_pos], or None
    g:    [batch, head, query_pos, d_head]  sum over integration steps of w_k * dF/dO_k

The attribution of one layer (docs/method.md section 1.4, "The fast algebra"):
    Attr = A * (G @ V^T)          with A = softmax(q k^T * scale + mask)
where the quadrature weights are already folded into G.
"""

from __future__ import annotations

import torch


def with_causal(mask: torch.Tensor | None, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """``mask`` plus the causal mask (-inf where key j comes after query i: ``j > i + key_pos -
    query_pos``), float32 (float64 for float64 q)."""
    n_q, n_k = q.shape[-2], k.shape[-2]
    allowed = torch.ones(n_q, n_k, dtype=torch.bool, device=q.device).tril(n_k - n_q)
    work = torch.float64 if q.dtype == torch.float64 else torch.float32
    causal_mask = torch.zeros(n_q, n_k, dtype=work, device=q.device).masked_fill(~allowed, float("-inf"))
    return causal_mask if mask is None else mask + causal_mask


def attention_probs(q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None, scale: float | None = None,
                    softcap: float | None = None) -> torch.Tensor:
    """Attention probabilities ``[batch, head, query_pos, key_pos]`` in the inputs' dtype.

    The softmax runs in float32 at least (as transformers' eager attention does for
    half precision), then casts back.
    """
    if scale is None:
        scale = q.shape[-1] ** -0.5
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if mask is not None:
        scores = scores + mask
    work = scores.dtype if scores.dtype == torch.float64 else torch.float32
    return torch.softmax(scores.to(work), dim=-1).to(q.dtype)


def attribution_from_grad(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                          mask: torch.Tensor | None = None, scale: float | None = None,
                          softcap: float | None = None, want_maps: bool = True) -> dict[str, torch.Tensor]:
    """Attribution of one layer from the summed output gradient ``g``.

    Returns a dict with
        ``maps``     [batch, head, query_pos, key_pos]  (only if ``want_maps``)
        ``head_sum`` [batch, query_pos, key_pos]        sum over heads
        ``head_max`` [batch, head]                      signed max over (i, j) per head
    All in float32 (float64 if any input is float64).

    Half-precision inputs (a model run in bfloat16 / float16) are upcast first, so the
    scores, the softmax, ``G V^T`` and the product are computed and accumulated in float32:
    the only low-precision rounding left is that of the inputs themselves.
    """
    wide = torch.float64 in (q.dtype, k.dtype, v.dtype, g.dtype)
    out_dtype = torch.float64 if wide else torch.float32
    q, k, v, g = (t.to(out_dtype) for t in (q, k, v, g))
    if mask is not None and mask.is_floating_point():
        mask = mask.to(out_dtype)
    a = attention_probs(q, k, mask, scale, softcap)
    gv = torch.matmul(g, v.transpose(-1, -2))
    maps = a * gv
    result = {
        "head_sum": maps.sum(dim=1),
        "head_max": maps.flatten(2).amax(dim=-1),
    }
    if want_maps:
        result["maps"] = maps
    return result


def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
                      scale: float | None = None, causal: bool = False) -> torch.Tensor:
    """Attention output ``O = softmax(q k^T * scale + mask) v`` ``[batch, head, query_pos, d_head]``.

    In q's dtype, through :func:`attention_probs` (softmax in float32 at least).
    ``causal`` masks key j for query i unless ``j <= i + key_pos - query_pos`` (the lower
    triangle when the lengths agree); a row with no allowed key gives NaN.
    """
    probs = attention_probs(q, k, with_causal(mask, q, k) if causal else mask, scale)
    return torch.matmul(probs, v)


def attribution_key_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                         mask: torch.Tensor | None = None, scale: float | None = None,
                         softcap: float | None = None, read_from: int | None = None) -> dict[str, torch.Tensor]:
    """Per key, the attribution summed over heads and query rows (the sources' quantity).

    ``key_sum`` [batch, key_pos] = sum_h sum_i A_hij (G_hi . V_hj), ``read_sum`` the same over
    the query rows ``i >= read_from`` (only when ``read_from`` is given), ``total`` [batch]
    (float64: the completeness sum) and ``head_max`` [batch, head], as
    :func:`attribution_from_grad` computes them, one head at a time (one ``n_q x n_k`` map
    alive, never the ``[batch, head, n_q, n_k]`` stack).
    """
    key_sum = read_sum = None
    maxima = []
    for h in range(q.shape[1]):
        part = slice(h, h + 1)
        head_mask = mask
        if mask is not None and mask.dim() == 4 and mask.shape[1] > 1:
            head_mask = mask[:, part]
        maps = attribution_from_grad(q[:, part], k[:, part], v[:, part], g[:, part], head_mask, scale, softcap,
                                     want_maps=True)["maps"][:, 0]
        ks = maps.sum(1)
        key_sum = ks if key_sum is None else key_sum + ks
        if read_from is not None:
            rs = maps[:, read_from:].sum(1)
            read_sum = rs if read_sum is None else read_sum + rs
        maxima.append(maps.flatten(1).amax(-1))
        del maps
    result = {"key_sum": key_sum, "total": key_sum.sum(-1, dtype=torch.float64), "head_max": torch.stack(maxima, 1)}
    if read_from is not None:
        result["read_sum"] = read_sum
    return result
