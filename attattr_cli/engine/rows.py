"""Row bookkeeping shared by the scorers that put several owners (examples of a group, steps
of a generation, layers of a sweep) in the rows of one pass: their gradients added up per
owner, one owner's saved projections cut from a padded pass, and clean outputs detached."""

from __future__ import annotations

import torch


def add_rows(total, low, f0: list, count: int, owner, part, g, f, row_alpha, row_ratio, summed: bool = False):
    """One pass of a fixed rule over several owners (examples or steps) added up: the rows
    ``part`` of the pass belong to ``owner[part]``; their weighted gradients ``g`` go to
    ``total`` (and, times the embedded rule's ratio, to ``low``), the F of their alpha = 0
    rows to ``f0``. ``summed``: each owner's rows (as many for each, owner-major) are summed
    first (a reduction), then added. Returns (total, low), made on first use."""
    ratio = None if row_ratio is None else g * row_ratio[part].view(-1, *[1] * (g.dim() - 1))
    if summed:
        owners = to_device(torch.unique_consecutive(owner[part]), g.device)  # on the host: no wait for the device
        total = _add(total, count, owners, _per_owner(g, len(owners)))
        low = low if ratio is None else _add(low, count, owners, _per_owner(ratio, len(owners)))
    else:
        own = to_device(owner[part], g.device)
        total = (g.new_zeros((count, *g.shape[1:])) if total is None else total).index_add_(0, own, g)
        if ratio is not None:
            low = (torch.zeros_like(total) if low is None else low).index_add_(0, own, ratio)
    zero = torch.nonzero(row_alpha[part] == 0).flatten().tolist()  # the host's alphas
    if zero:  # their F in one copy to the host
        for r, value in zip(zero, f[zero].tolist()):
            f0[int(owner[part][r])] = value
    return total, low


def _per_owner(g, owners: int):
    """Rows summed per owner: [owners, ...]."""
    return g.sum(0, keepdim=True) if owners == 1 else g.view(owners, -1, *g.shape[1:]).sum(1)


def _add(total, count: int, owners, s):
    """``s`` (one row per owner in ``owners``) added to ``total`` [count, ...] (made on first use)."""
    if total is None and len(owners) == count:  # every owner, in order
        return s
    return (s.new_zeros((count, *s.shape[1:])) if total is None else total).index_add_(0, owners, s)


def crop_saved(saved: dict, n: int) -> dict:
    """One example's saved projections ([1, head, N, d] of the padded group) cut to its n tokens."""
    out = {k: v for k, v in saved.items() if k not in ("probs", "out")}  # A made for the whole length: not the crop's
    for key in ("q", "k", "v"):
        out[key] = saved[key][:, :, :n]
    mask = saved["mask"]
    if mask is not None:
        mask = mask[..., :min(n, mask.shape[-2]), :n]
        blocked = mask <= torch.finfo(mask.dtype).min / 2 if mask.is_floating_point() else ~mask.bool()
        out["mask"] = mask if bool(blocked.any()) else None  # as at batch 1: no padding, no mask
    return out


def to_device(t: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``t`` on ``device``, the same values: from the host to a CUDA device pinned and not
    blocking (a plain copy waits for the device's queue: a host synchronisation), made before a
    pass so that the pass itself copies nothing from the host (issue 53)."""
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def detached(obj):
    if torch.is_tensor(obj):
        return obj.detach()
    if isinstance(obj, tuple):
        return tuple(detached(o) for o in obj)
    return obj
