"""Attention / attribution ops and the backend selector.

Two backends compute the same things: ``torch`` (:mod:`attattr_cli.ops.reference`, pure
PyTorch, any device, dtype, additive mask, softcap) and ``cuda`` (the fused kernels of
:mod:`attattr_cli.ops.kernel`, no stored n x n probabilities). Inputs the kernels do not support
(softcap, a general ``[batch, 1, query_pos, key_pos]`` mask, float64, CPU tensors, inputs that
require grad while grad mode is on) are routed to the reference, so a caller can always use the
backend it was given; ``backend.supports(q, mask, softcap)`` says which path runs.

Masks given to a backend: ``None``; a 2-D ``[batch, key_pos]`` additive key-padding mask
(0 or a large negative such as ``torch.finfo(torch.float32).min``); or any additive mask
broadcastable to ``[batch, head, query_pos, key_pos]`` with 4 dimensions (a
``[batch, 1, 1, key_pos]`` one counts as key padding). :func:`select_backend` picks one.
"""

from __future__ import annotations

import os
import warnings

import torch

from attattr_cli.errors import OptionError
from attattr_cli.ops import kernel, reference
from attattr_cli.ops.reference import with_causal

__all__ = ["BACKEND_KINDS", "ENV_VAR", "Backend", "CudaBackend", "TorchBackend", "select_backend"]

BACKEND_KINDS = ("auto", "cuda", "torch")
ENV_VAR = "ATTATTR_KERNEL"

_warned: set[str] = set()


def reference_mask(mask: torch.Tensor | None, q=None, k=None, causal: bool = False) -> torch.Tensor | None:
    """A backend mask in the reference's convention (broadcastable to [B, H, n_q, n_k]), with
    ``causal`` the causal mask of ``q`` and ``k`` added."""
    if mask is not None and mask.dim() == 2:  # key padding [batch, key_pos]
        mask = mask[:, None, None, :]
    return with_causal(mask, q, k) if causal else mask


class Backend:
    """Computes attention outputs and attributions; see the module docstring."""

    name: str = ""

    def supports(self, q: torch.Tensor, mask: torch.Tensor | None = None, softcap: float | None = None) -> bool:
        """True when this backend's own implementation handles these inputs."""
        raise NotImplementedError

    def attention_forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          mask: torch.Tensor | None = None, scale: float | None = None, causal: bool = False
                         ) -> torch.Tensor:
        """``O = softmax(q k^T * scale + mask) v`` ``[batch, head, query_pos, d_head]`` in q's dtype."""
        raise NotImplementedError

    def attribution_from_grad(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                              mask: torch.Tensor | None = None, scale: float | None = None,
                              softcap: float | None = None, want_maps: bool = True, causal: bool = False
                             ) -> dict[str, torch.Tensor]:
        """Dict ``head_sum`` [B, n_q, n_k], ``head_max`` [B, H], ``maps`` [B, H, n_q, n_k] (if asked)."""
        raise NotImplementedError

    def attribution_key_sums(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                             mask: torch.Tensor | None = None, scale: float | None = None,
                             softcap: float | None = None, causal: bool = False, read_from: int | None = None
                            ) -> dict[str, torch.Tensor]:
        """The sources' quantity with no ``n_q x n_k`` array kept: dict ``key_sum`` [B, n_k]
        (summed over heads and query rows), ``read_sum`` [B, n_k] (rows ``>= read_from``; only
        when given), ``total`` [B] (float64) and ``head_max`` [B, H]."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<attattr {self.name} backend>"


class TorchBackend(Backend):
    """The pure-PyTorch reference (:mod:`attattr_cli.ops.reference`)."""

    name = "torch"

    def supports(self, q, mask=None, softcap=None) -> bool:
        return True

    def attention_forward(self, q, k, v, mask=None, scale=None, causal=False):
        return reference.attention_forward(q, k, v, reference_mask(mask), scale, causal)

    def attribution_from_grad(self, q, k, v, g, mask=None, scale=None, softcap=None, want_maps=True, causal=False):
        mask = reference_mask(mask, q, k, causal)
        return reference.attribution_from_grad(q, k, v, g, mask, scale, softcap, want_maps)

    def attribution_key_sums(self, q, k, v, g, mask=None, scale=None, softcap=None, causal=False, read_from=None):
        return reference.attribution_key_sums(q, k, v, g, reference_mask(mask, q, k, causal), scale, softcap, read_from)


class CudaBackend(Backend):
    """The fused CUDA kernels, falling back to the reference for unsupported inputs."""

    name = "cuda"

    def __init__(self) -> None:
        self._fallback = TorchBackend()

    def supports(self, q, mask=None, softcap=None) -> bool:
        return kernel.supports(q, mask, softcap)

    def _use_kernel(self, q, k, mask, softcap, tensors) -> bool:
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return False  # the kernels have no backward
        return kernel.supports(q, mask, softcap, k)

    def attention_forward(self, q, k, v, mask=None, scale=None, causal=False):
        if self._use_kernel(q, k, mask, None, (q, k, v)):
            return kernel.attention_forward(q, k, v, mask, scale, causal)
        return self._fallback.attention_forward(q, k, v, mask, scale, causal)

    def attribution_from_grad(self, q, k, v, g, mask=None, scale=None, softcap=None, want_maps=True, causal=False):
        if self._use_kernel(q, k, mask, softcap, (q, k, v, g)):
            return kernel.attribution_from_grad(q, k, v, g, mask, scale, softcap, want_maps, causal=causal)
        return self._fallback.attribution_from_grad(q, k, v, g, mask, scale, softcap, want_maps, causal)

    def attribution_key_sums(self, q, k, v, g, mask=None, scale=None, softcap=None, causal=False, read_from=None):
        if self._use_kernel(q, k, mask, softcap, (q, k, v, g)):
            return kernel.attribution_key_sums(q, k, v, g, mask, scale, softcap, causal=causal, read_from=read_from)
        return self._fallback.attribution_key_sums(q, k, v, g, mask, scale, softcap, causal, read_from)


_TORCH = TorchBackend()
_CUDA = CudaBackend()


def _env_kind() -> str:
    value = os.environ.get(ENV_VAR, "").strip().lower()
    if value and value not in BACKEND_KINDS:
        raise OptionError(f"{ENV_VAR}={os.environ[ENV_VAR]!r} is not a kernel backend; choose one of: "
                          + ", ".join(BACKEND_KINDS))
    return value or "auto"


def _device(device) -> torch.device:
    if device is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise OptionError(f"not a device: {device!r} ({error})") from None


def select_backend(kind: str = "auto", device: torch.device | str | None = None) -> Backend:
    """The attention backend for ``kind`` ("auto", "cuda" or "torch") on ``device``.

    ``device`` defaults to CUDA when one is visible, else CPU.  "auto" gives "cuda" when the
    device is CUDA, the kernels are available (built on first use) and ``ATTATTR_KERNEL``
    is not "torch" (``ATTATTR_KERNEL=cuda`` makes "auto" behave as "cuda"); otherwise
    "torch", with a warning when a CUDA device is there but the kernels failed.  "cuda"
    raises :class:`OptionError` with the loader's reason when the kernels cannot be had.
    """
    chosen = (kind or "auto").strip().lower() if isinstance(kind, str) else kind
    if chosen not in BACKEND_KINDS:
        raise OptionError(f"unknown kernel backend {kind!r}; choose one of: " + ", ".join(BACKEND_KINDS))
    dev = _device(device)
    if chosen == "torch":
        return _TORCH
    if chosen == "auto":
        env = _env_kind()
        if env == "torch":
            return _TORCH
        if env == "cuda":
            chosen = "cuda"
    if chosen == "cuda":
        if not kernel.available():
            raise OptionError(f"the cuda kernel backend is unavailable: {kernel.unavailable_reason(hint=False)};"
                              " use the torch backend instead (--kernel torch)")
        if dev.type != "cuda":
            raise OptionError(f"the cuda kernel backend needs a CUDA device, got {dev}; use the torch backend instead"
                              " (--kernel torch)")
        return _CUDA
    # auto
    if dev.type != "cuda":
        return _TORCH
    if kernel.available():
        return _CUDA
    reason = kernel.unavailable_reason()
    if reason not in _warned:
        _warned.add(reason)
        warnings.warn(f"attattr: the CUDA kernels are unavailable ({reason}); using the torch backend", RuntimeWarning,
                      stacklevel=2)
    return _TORCH
