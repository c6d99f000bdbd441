"""What a run will need: an estimate of its peak memory and of its store size per ``--keep``
mode, said before a long run, and the refusal of a run that would exceed ``--memory``.

Peak memory of one example, in bytes (n tokens, L scored layers, H heads, S steps of a generation,
1 otherwise): RUNTIME (Python, torch, transformers) and the weights; the larger of the clean
forward kept for its backward and one integration pass of as many rows as run at once
(``memory.step_bytes``); one layer's maps as they are made (4 H n² floats: maps are reduced layer
by layer); with ``--tol`` the refinement's arrays counted at the node cap (a bound); and what is
kept, for the example and each step: ``maps`` L H n² (held twice while stacked) and the clean
attention, ``sum`` L n² and the mean attention, ``sources`` 2 L n, ``--top-k K`` L H K entries.
The store holds what is kept, uncompressed (gzip takes a little off maps). docs/long-context.md,
"Peak memory", compares the estimate with the bench's measured peak RSS.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import OptionError, ResourceError

RUNTIME = 450 << 20  # Python with torch and transformers imported, a model's run-time buffers
FREE_FRACTION = 0.8  # the default --memory: this much of the memory available now, and what the process holds
MAX_ROWS = 32  # rows of one integration pass counted per step at most (a refinement level's new nodes)
LONG_RUN_TOKENS = 256  # a run with an example this long has its estimate said before it starts
RICHEST_FIRST = ("maps", "sum", "sources")

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([kmgt]?i?b?)?\s*$", re.I)
_UNITS = {"": 1, "b": 1, "k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12}


def parse_size(value) -> int | None:
    """Bytes from a size: a number of bytes or a string such as ``4GB``, ``500MB``, ``2GiB``
    (None stays None); OptionError otherwise."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise OptionError(f"--memory must be a size such as 4GB, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise OptionError(f"--memory must be a positive size, got {value}")
        return int(value)
    m = _SIZE.match(str(value))
    if not m:
        raise OptionError(f"--memory must be a size such as 4GB or 500MB, got {value!r}")
    unit = (m.group(2) or "").lower()
    prefix = unit[:1] if unit[:1] in "kmgt" else ""
    factor = 1024 ** ("kmgt".index(prefix) + 1) if prefix and "i" in unit else _UNITS[prefix]
    size = int(float(m.group(1)) * factor)
    if size <= 0:
        raise OptionError(f"--memory must be a positive size, got {value!r}")
    return size


def human(n: float) -> str:
    """A byte count as people read it: 812 kB, 1.9 GB."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}" if n < 10 * size else f"{n / size:.0f} {unit}"
    return f"{int(n)} B"


def available() -> int:
    """Bytes this process may still take on this machine (MemAvailable), and what it holds now."""
    from .memory import proc_bytes

    free, held = proc_bytes("/proc/meminfo", "MemAvailable"), proc_bytes("/proc/self/status", "VmRSS")
    return int((free if free is not None else 8 << 30) * FREE_FRACTION + (held or 0))


@dataclass
class Estimate:
    index: int
    tokens: int
    steps: int
    keep: str
    peak: int
    store: int

    def line(self, budget: int) -> str:
        gen = f", {self.steps} steps" if self.steps > 1 else ""
        return (f"estimate for example {self.index} ({self.tokens} tokens{gen}, --keep {self.keep}): peak memory about"
                f" {human(self.peak)}, store about {human(self.store)} (--memory {human(budget)})")


def estimate(scorer, enc, index: int = 0, keep: str | None = None, store_dtype: str = "float32") -> Estimate:
    """Peak memory and store bytes of one encoded example (see the module docstring)."""
    import torch

    from . import memory

    keep = keep or scorer.keep_for(enc)
    model, arch, cfg = scorer.model, scorer.arch, scorer.model.config
    fam = scorer.families[0]
    n = max(len(enc.input_ids), len(enc.decoder_input_ids or []))
    layers = sum(len(v) for v in scorer.layers_of.values())
    heads = fam.num_heads
    el = torch.tensor([], dtype=scorer.dtype).element_size()
    steps = len(enc.lm_positions) if scorer.options.stepwise and enc.lm_positions else 1
    kept_positions = len(enc.lm_positions) if enc.lm_positions is not None else 1
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    site0 = (fam.name, min(scorer.layers_of[fam.name]) if scorer.layers_of[fam.name] else 0)
    clean = memory.step_bytes(cfg, arch, (fam.name, 0), n, scorer.dtype, scorer.device, kept_positions,
                              scorer.options.lm)
    per_row = memory.step_bytes(cfg, arch, site0, n, scorer.dtype, scorer.device, kept_positions, scorer.options.lm)
    if scorer.device.type != "cuda" and scorer.options.lm and not arch.is_encoder_decoder:
        # a causal LM's layers run PyTorch's fused attention on CPU too (is_causal, no mask): no
        # n x n probabilities (3 H n² per layer) kept for the backward (step_bytes counts them on CPU)
        clean -= el * fam.num_layers * 3 * heads * n * n
        per_row -= el * (fam.num_layers - site0[1]) * 3 * heads * n * n
    # rows per pass as the integration picks them (engine/layer_integral.py): --tol's levels and a
    # generation's steps fill a pass up to what the CPU's tokens-per-pass rule or the memory allows
    rows = scorer.options.step_batch or memory.steps_that_fit(per_row, MAX_ROWS * steps, n, scorer.device,
                                                              memory.hidden_size(cfg))
    work = max(clean, rows * per_row)
    transient = 4 * heads * n * n * 4
    refine = 0
    if scorer.options.tol is not None:
        # per integral at the node cap N: every node's dF/dO (H n dim in the accumulation dtype) and,
        # for at most N / 4 leaves, its rule's G and its estimate's in float64 and the estimate's copy in
        # the compute dtype that the error estimate stacks
        dim = int(getattr(cfg, "head_dim", None) or memory.hidden_size(cfg) // max(heads, 1))
        acc = 8 if scorer.dtype == torch.float64 else 4
        cap = scorer.options.max_nodes
        refine = steps * (cap * acc + cap // 4 * (16 + el)) * heads * n * dim
    copies = steps + (1 if steps > 1 else 0)  # a generation keeps every step's and the summed results
    top = 0 if scorer.options.top_k is None else layers * heads * scorer.options.top_k * 12 * copies
    all_layers = fam.num_layers
    if keep in ("maps", "sum"):  # per layer [head, n, n] or [n, n], held twice while stacked; the clean attention
        square = n * n * (heads if keep == "maps" else 1)
        kept = layers * square * 4 * copies * 2 + all_layers * square * 4
        stored = layers * square * copies + all_layers * square
    elif keep == "sources":  # key_sum, and read_sum where the prompt has sources (store schema 1.6)
        arrays = 2 if scorer.options.sources is not None else 1
        kept = layers * n * 4 * copies * arrays
        stored = layers * n * copies * arrays
    else:
        kept = stored = 0
    item = 2 if store_dtype == "float16" else 4
    small = n * 64 + layers * (heads * 4 + 40) * copies
    return Estimate(index, n, steps, keep, int(RUNTIME + weights + work + transient + refine + kept + top),
                    int(stored * item + top + small))


def check(scorer, encoded: dict, budget: int | None, store_dtype: str = "float32") -> tuple[list[str], int]:
    """The estimate of the largest example (lines to say before a long run: none for short
    ones) and the budget it was checked against; ResourceError naming the ``--keep`` that fits
    where its peak would exceed ``budget`` (default: :func:`available`)."""
    if not encoded:
        return [], 0
    if budget is None and scorer.device.type != "cpu":
        budget = 1 << 62  # the estimate counts host memory and CPU attention: a GPU run is refused only at --memory
    budget = available() if budget is None else int(budget)
    index, enc = max(encoded.items(), key=lambda kv: (max(len(kv[1].input_ids), len(kv[1].decoder_input_ids or [])),
                                                      len(kv[1].lm_positions or [])))
    est = estimate(scorer, enc, index, store_dtype=store_dtype)
    if est.peak > budget:
        fits = [k for k in RICHEST_FIRST if k != est.keep and estimate(scorer, enc, index, k).peak <= budget]
        richer = [k for k in fits if RICHEST_FIRST.index(k) < RICHEST_FIRST.index(est.keep)] \
            if est.keep in RICHEST_FIRST else []
        hint = (f"--keep {fits[0]} fits (about {human(estimate(scorer, enc, index, fits[0]).peak)})"
                if fits and not richer else f"--keep {fits[0]} fits" if fits else
                "no --keep fits: give fewer --layers, a shorter input or more --memory")
        raise ResourceError(f"example {index} ({est.tokens} tokens, --keep {est.keep}) needs about {human(est.peak)}"
                            f" of memory, over --memory {human(budget)}: {hint}")
    lines = [est.line(budget).replace(f" (--memory {human(1 << 62)})", "")] if est.tokens >= LONG_RUN_TOKENS else []
    return lines, budget
