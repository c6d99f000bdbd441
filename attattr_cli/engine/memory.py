"""Memory: how much a pass may use, how many integration steps fit in one pass, the
out-of-memory back-off of the step micro-batching (halve and retry, say so once), and the
copies of results from a GPU to the host."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Iterator

import torch

from ..errors import ResourceError, first_line

# on CPU a pass of more rows than this is no faster per row, so the automatic micro-batch stops
# there: tokens per pass at hidden size CPU_REFERENCE_HIDDEN (MiniLM); a model of hidden size h
# gets CPU_TOKENS_PER_PASS * CPU_REFERENCE_HIDDEN / h (measured: docs/models.md, docs/integration.md)
CPU_TOKENS_PER_PASS = 2048
CPU_REFERENCE_HIDDEN = 384


def free_memory(device: torch.device) -> int:
    """Bytes a pass may use: most of the free CUDA memory, or half the available RAM."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        # blocks PyTorch's caching allocator holds but does not use are free for us too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(free * 0.7)
    free = proc_bytes("/proc/meminfo", "MemAvailable")
    return 4 << 30 if free is None else free // 2


def proc_bytes(path: str, name: str) -> int | None:
    """The bytes of a ``name:`` line (in kB) of a /proc file; None where it cannot be read."""
    try:
        with open(path) as fh:
            for line in fh:
                if line.startswith(name + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A CPU copy of ``t`` (``t`` itself on the CPU). From a CUDA device the copy goes through
    page-locked memory, not the driver's slow pageable path (docs/benchmarks.md, "GPU, kernels and
    the rest"). The result is page-locked memory from PyTorch's caching host allocator:
    callers stack or copy it into their results (``torch.stack``, ``.clone()``) and drop it, so
    the same blocks serve the next layer and example."""
    if t.device.type != "cuda":
        return t.cpu()
    host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
    host.copy_(t, non_blocking=True)
    torch.cuda.current_stream(t.device).synchronize()
    return host


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch.cuda.OutOfMemoryError and the RuntimeErrors other backends raise when memory runs out."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "not enough memory" in text)


def step_bytes(config, arch, site: tuple[str, int], n: int, dtype: torch.dtype, device: torch.device,
               kept: int = 1, lm: bool = False) -> int:
    """Estimated bytes one integration step of ``site`` (family, layer) keeps for the backward
    through the layers at and above it, for ``n`` tokens (``kept`` LM positions)."""
    family, layer = site
    hidden = hidden_size(config)
    inter = (getattr(config, "intermediate_size", None) or getattr(config, "decoder_ffn_dim", None)
             or getattr(config, "n_inner", None) or 4 * hidden)
    inter = int(max(inter) if isinstance(inter, (list, tuple)) else inter)  # per layer (Gemma 3n): the widest
    fam = arch.family(family)
    above = fam.num_layers - layer
    if family == "encoder":  # the whole decoder runs above an encoder target
        above += arch.family("decoder").num_layers
    heads = fam.num_heads
    el = torch.tensor([], dtype=dtype).element_size()
    fused = device.type == "cuda"  # SDPA keeps no n x n probabilities for backward
    per_layer = n * (14 * hidden + 3 * inter) + (0 if fused else 3 * heads * n * n)
    vocab = int(getattr(config, "vocab_size", 0)) if lm else 0
    return int(el * above * per_layer + 12 * kept * vocab + 8 * n * hidden)


def hidden_size(config) -> int:
    """The model's hidden size, whatever its config calls it."""
    return int(getattr(config, "hidden_size", None) or getattr(config, "d_model", None)
               or getattr(config, "n_embd", 768))


def steps_that_fit(per_step: int, steps: int, n: int, device: torch.device, hidden: int = CPU_REFERENCE_HIDDEN) -> int:
    """Steps per pass (at most ``steps``) whose ``per_step`` bytes fit the free memory of
    ``device``; on CPU also at most CPU_TOKENS_PER_PASS tokens per pass, scaled by
    CPU_REFERENCE_HIDDEN / ``hidden`` (the model's hidden size)."""
    fit = free_memory(device) // max(per_step, 1)
    if device.type == "cpu":
        tokens = CPU_TOKENS_PER_PASS * CPU_REFERENCE_HIDDEN // max(hidden, 1)
        fit = min(fit, max(1, tokens // n))
    return int(max(1, min(max(steps, 1), fit)))


class BackOff:
    """The step micro-batch's out-of-memory back-off: the lowered size is kept for later
    layers and examples, and the first halving is said once through ``warn``."""

    def __init__(self, device: torch.device, dtype_name: str):
        self.device = device
        self.dtype_name = dtype_name
        self.limit: int | None = None
        self.warned = False

    def cap(self, size: int) -> int:
        return size if self.limit is None else min(size, self.limit)

    def chunks(self, count: int, size: int, run: Callable[[slice], Any],
               warn: Callable[[str], None] | None = None) -> Iterator[tuple[slice, Any]]:
        """``run`` over ``range(count)`` in slices of at most ``size`` (capped by an earlier
        back-off): yields (slice, what run returned). A slice that runs out of memory is
        halved and retried (``halve``); other errors propagate."""
        size, start = self.cap(size), 0
        while start < count:
            part = slice(start, min(start + size, count))
            try:
                out = run(part)
            except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
                if not is_out_of_memory(exc):
                    raise
                failed = first_line(exc)
            else:
                failed = None
            if failed is not None:  # out of the except block: the failed pass's tensors are free now
                size = self.halve(part.stop - part.start, failed, warn)
                continue
            yield part, out
            start = part.stop

    def halve(self, size: int, reason: str, warn: Callable[[str], None] | None = None) -> int:
        """A micro-batch of ``size`` steps ran out of memory (``reason``): the next size to try,
        or ResourceError at one step."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if size <= 1:
            raise ResourceError(
                f"out of memory on {self.device} even with one integration step per pass"
                f" (dtype {self.dtype_name}): use a smaller model,"
                f" --dtype bfloat16, --layers, or a device with more memory ({reason})"
            )
        smaller = max((size + 1) // 2, 1)
        self.limit = smaller
        if not self.warned:
            self.warned = True
            message = (f"out of memory with {size} integration steps per pass on {self.device}; "
                       f"halving the step micro-batch (now {smaller}, and lower if needed). "
                       "Results do not change; pass --steps-per-pass to start lower.")
            if warn is not None:
                warn(message)
            else:
                warnings.warn(message, ResourceWarning, stacklevel=2)
        return smaller
