"""Launch accounting and CUDA-graph replay of integration passes (docs/benchmarks.md, "GPU,
kernels and the rest": a short input's pass is thousands of small kernels, each a launch).

* :class:`OpCounter`: counts the aten ops a block runs, on any device (the CPU too), into those
  that launch a kernel on a GPU and those that do not, and by named region: a lower bound of the
  launches, measured without a GPU (``bench/bench_kernel.py --count-ops``).
* :class:`CapturedPass`: captures a function of fixed-shape tensors (one integration pass) into a
  ``torch.cuda.CUDAGraph`` once, then copies new inputs in and replays it: one launch per pass.
  On by ``ATTATTR_CUDA_GRAPHS=1``; otherwise, or where capture is impossible, it calls the
  function eagerly and says why, so results never depend on it. The function's Python side
  effects happen at capture only; tensors it created (``aux``) live in the graph's memory pool
  and are rewritten by every replay.
* ``ATTATTR_CUDA_GRAPHS=emulate``: the same capture and replay on any device, the graph
  emulated by :class:`_Recorded` (the aten ops of one call recorded with the very tensors they
  read and wrote, replayed on those tensors): what a CUDA graph bakes in (Python control flow,
  which tensors are read, any tensor a closure held at capture) is baked in the same way, so a
  pass that would replay wrong numbers on a GPU replays them on the CPU too (tests/test_sweep.py).
"""

from __future__ import annotations

import contextlib
import os
from collections import Counter, OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ENV_VAR", "CapturedPass", "OpCounter", "StaticSlots", "emulated", "enabled", "owned"]

ENV_VAR = "ATTATTR_CUDA_GRAPHS"
GIVE_UP = 2  # failed captures (a pass that waits for the device inside, memory) after which none is tried

# ops that never launch a kernel on a CUDA device: allocations without a fill, and
# metadata / view ops (besides every op whose schema says it is a view)
_NO_LAUNCH = {
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::detach", "aten::alias", "aten::lift_fresh",
    "aten::_unsafe_view", "aten::view", "aten::reshape", "aten::as_strided", "aten::t",
    "aten::transpose", "aten::permute", "aten::expand", "aten::squeeze", "aten::unsqueeze",
    "aten::slice", "aten::select", "aten::split", "aten::split_with_sizes", "aten::unbind",
    "aten::chunk", "aten::narrow", "aten::unflatten", "aten::flatten", "aten::set_",
    "aten::resize_", "aten::is_nonzero", "aten::sym_size", "aten::sym_stride", "aten::sym_numel",
    "aten::_reshape_alias", "aten::view_as", "aten::diagonal", "aten::unfold",
}
# ops that wait for the device (a host synchronisation on CUDA): they end a capture
_SYNC = {"aten::_local_scalar_dense", "aten::item", "aten::nonzero", "aten::equal", "aten::masked_select",
         "aten::unique_consecutive", "aten::_unique2", "aten::_unique"}
# ops that synchronise only with some arguments: boolean-mask indexing (a nonzero inside on
# CUDA) and copies between the host and a device (a blocking copy waits for the stream)
_INDEX = {"aten::index", "aten::index_put", "aten::index_put_", "aten::_index_put_impl_"}
_COPY = {"aten::_to_copy", "aten::copy_"}


def _tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for item in obj:
            yield from _tensors(item)


def is_sync(func, args=(), kwargs=None) -> bool:
    """Whether the aten op ``func`` on ``args`` waits for the device on CUDA: the ops of
    ``_SYNC``, indexing by a boolean mask, and a copy from or to the host (``.cpu()``, a host
    tensor ``.to(device)``) that is not ``non_blocking``. Counted on any device: on the CPU
    the host copies are the ones that name another device."""
    name = func._schema.name
    if name in _SYNC:
        return True
    kwargs = kwargs or {}
    if name in _INDEX:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(indices))
    if name in _COPY and not kwargs.get("non_blocking", False):
        if name == "aten::copy_":
            devices = {t.device.type for t in _tensors(args[:2])}
        else:
            src = args[0] if args else None
            target = kwargs.get("device")
            devices = {src.device.type} if isinstance(src, torch.Tensor) else set()
            if target is not None:
                devices.add(torch.device(target).type)
        return "cpu" in devices and len(devices) > 1
    return False


def enabled() -> bool:
    """``ATTATTR_CUDA_GRAPHS=1`` (or ``emulate``) in the environment (read at every call)."""
    return os.environ.get(ENV_VAR, "").strip() in ("1", "emulate")


def owned(mapping: dict) -> dict:
    """A new dict of ``mapping`` whose tensors are copies: a graph's aux lives in its memory pool,
    which other graphs' replays may write, and a dict handed back by every replay would carry
    what a caller cached in it (a layer's attention) from one example to the next."""
    return {k: x.clone() if isinstance(x, torch.Tensor) else x for k, x in mapping.items()}


def emulated() -> bool:
    """``ATTATTR_CUDA_GRAPHS=emulate``: graphs captured and replayed by :class:`_Recorded`."""
    return os.environ.get(ENV_VAR, "").strip() == "emulate"


@dataclass
class OpCounts:
    """Counts of one region (or of everything)."""

    total: int = 0
    launching: int = 0  # ops that are at least one kernel on a CUDA device
    syncs: int = 0  # host synchronisations (item(), nonzero, ...)
    by_op: Counter = field(default_factory=Counter)
    sync_sites: Counter = field(default_factory=Counter)  # "file:line" of each sync (with ``where=True``)

    def as_dict(self, top: int = 12) -> dict:
        out = {"total": self.total, "launching": self.launching, "syncs": self.syncs,
               "top": dict(self.by_op.most_common(top))}
        if self.sync_sites:
            out["sync_sites"] = dict(self.sync_sites.most_common(top))
        return out


class OpCounter(TorchDispatchMode):
    """Counts the aten ops run inside ``with OpCounter() as c:`` (any device).

    ``c.all`` holds everything; ``with c.region("name"):`` also counts into ``c.regions[name]``
    (regions nest: an op counts in every open region, once) and ``c.entries[name]`` the times a
    region was entered from outside it (a region entered again inside itself is one entry).
    The ops of the backward pass count too (autograd dispatches them below this mode, on this
    thread for CPU tensors). ``where=True``: each host synchronisation's place in attattr's
    code (the innermost frame under ``attattr_cli/``, else the innermost outside torch) counts in
    ``sync_sites`` of every count it adds to.
    """

    def __init__(self, where: bool = False) -> None:
        super().__init__()
        self.all = OpCounts()
        self.regions: dict[str, OpCounts] = {}
        self.entries: Counter = Counter()
        self._open: list[str] = []
        self.where = where

    @contextlib.contextmanager
    def region(self, name: str):
        self.regions.setdefault(name, OpCounts())
        if name not in self._open:
            self.entries[name] += 1
        self._open.append(name)
        try:
            yield self
        finally:
            self._open.pop()

    @staticmethod
    def launches(func) -> bool:
        name = func._schema.name
        return not (name in _NO_LAUNCH or getattr(func, "is_view", False))

    def _add(self, counts: OpCounts, name: str, launching: bool, sync: bool, site: str | None) -> None:
        counts.total += 1
        counts.launching += launching
        counts.syncs += sync
        if launching:
            counts.by_op[name] += 1
        if sync and site is not None:
            counts.sync_sites[f"{site} ({name})"] += 1

    @staticmethod
    def _site() -> str:
        import traceback

        frames = [f for f in traceback.extract_stack()[:-3] if "/torch/" not in f.filename.replace("\\", "/")]
        ours = [f for f in frames if "attattr_cli" in f.filename.replace("\\", "/") and "ops/graphs.py" not in f.filename]
        frame = (ours or frames)[-1]
        path = frame.filename.replace("\\", "/")
        path = path[path.rfind("attattr_cli/"):] if "attattr_cli/" in path else path.rsplit("/", 1)[-1]
        return f"{path}:{frame.lineno}"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        launching = self.launches(func)
        sync = is_sync(func, args, kwargs)
        site = self._site() if sync and self.where else None
        self._add(self.all, name, launching, sync, site)
        for region in set(self._open):
            self._add(self.regions[region], name, launching, sync, site)
        return func(*args, **(kwargs or {}))


def _flat_tensors(out) -> tuple[torch.Tensor, ...]:
    if isinstance(out, torch.Tensor):
        return (out,)
    if not isinstance(out, (tuple, list)) or not all(isinstance(t, torch.Tensor) for t in out):
        raise TypeError("a captured pass returns a tensor or a tuple of tensors (and aux)")
    return tuple(out)


@dataclass
class _Captured:
    graph: Any
    inputs: tuple[torch.Tensor, ...]
    outputs: tuple[torch.Tensor, ...]
    aux: Any


def _flat(out) -> list:
    return list(out) if isinstance(out, (tuple, list)) else [out]


class _Recorded(TorchDispatchMode):
    """A CUDA graph's semantics on any device: ``with _Recorded() as graph: fn(*static)`` keeps
    every aten op of the call (the backward's too) with the tensors it read and wrote;
    ``graph.replay()`` runs those ops again on those same tensors, writing each result into the
    tensor the capture made (views and in-place results alias their inputs and follow them).
    Like a capture on a GPU it refuses an op that waits for the device (an ``item()``, a
    ``nonzero``, indexing by a mask): a pass that syncs fails here as it would there."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func._schema.name in _SYNC or (func._schema.name in _INDEX and is_sync(func, args, kwargs)):
            raise RuntimeError(f"{func._schema.name} waits for the device ({OpCounter._site()}): not permitted "
                               "while a graph is captured")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out

    def replay(self) -> None:
        with torch.no_grad():
            for func, args, kwargs, out in self.ops:
                made = func(*args, **kwargs)
                read = {t.untyped_storage().data_ptr() for t in _tensors(list(args) + list(kwargs.values()))}
                for old, new in zip(_flat(out), _flat(made)):
                    if isinstance(old, torch.Tensor) and old is not new \
                            and old.untyped_storage().data_ptr() not in read:
                        old.copy_(new)


class CapturedPass:
    """Capture once, replay after: ``run(key, fn, *inputs)``.

    ``fn(*inputs)`` returns a tensor or a tuple of tensors, or, with ``aux=True``, a pair
    ``(tensors, aux)`` whose ``aux`` (any object) is handed back as it was at capture.  Inputs
    are tensors whose shapes, dtypes and devices, with ``key`` (any hashable naming what else
    the pass depends on: the example, the layer, the target), select the graph; each new
    combination is captured once (after ``warmup`` eager calls on a side stream, as CUDA
    graphs require), later calls copy the inputs in and replay.  Outputs are cloned out of
    the graph's memory, so a later replay does not change them.

    Eager (and counted in ``eager_calls``) when: not enabled (``enabled=None`` reads
    ``ATTATTR_CUDA_GRAPHS``), any input not on a CUDA device (unless ``emulate``), a capture
    already running, the capture of that key failed (``fallback_reasons[key]``), or GIVE_UP
    captures failed already (a model whose passes wait for the device fails them all). Past
    ``max_graphs`` graphs the least recently replayed one is let go. ``emulate`` (None: reads
    ``ATTATTR_CUDA_GRAPHS=emulate``): graphs are :class:`_Recorded` on any device.
    """

    def __init__(self, enabled: bool | None = None, warmup: int = 2, max_graphs: int = 256,
                 aux: bool = False, emulate: bool | None = None) -> None:
        self._enabled = enabled
        self.emulate = emulated() if emulate is None else emulate
        self.warmup = warmup
        self.max_graphs = max_graphs
        self.with_aux = aux
        self.graphs: OrderedDict[Any, _Captured] = OrderedDict()
        self.held: dict = {}  # what a caller's graphs read besides their inputs (a sweep's plan), kept with them
        self.fallback_reasons: dict[Any, str] = {}
        self.captures = self.replays = self.eager_calls = 0
        self.failed: list[str] = []  # the reasons of failed captures: after GIVE_UP of them none is tried
        self._pool = None

    @property
    def enabled(self) -> bool:
        return enabled() if self._enabled is None else bool(self._enabled)

    def _split(self, out):
        if self.with_aux:
            tensors, aux = out
            return _flat_tensors(tensors), aux
        return _flat_tensors(out), None

    def _join(self, tensors, aux):
        return (tensors, aux) if self.with_aux else tensors

    def _why_eager(self, full_key, inputs) -> str:
        if not self.enabled:
            return ""  # not a fallback: simply off
        if not inputs or (not self.emulate and any(t.device.type != "cuda" for t in inputs)):
            return "inputs not on a CUDA device"
        if not self.emulate and torch.cuda.is_current_stream_capturing():
            return "inside another capture"
        if full_key not in self.fallback_reasons and len(self.failed) >= GIVE_UP:
            return f"{self.failed[-1]} (no more captures tried after {GIVE_UP} failed)"
        return self.fallback_reasons.get(full_key, "")

    def eager(self, fn: Callable, inputs):
        self.eager_calls += 1
        tensors, aux = self._split(fn(*inputs))
        return self._join(tensors, aux)

    def run(self, key, fn: Callable, *inputs: torch.Tensor):
        full_key = (key, tuple((tuple(t.shape), t.dtype, str(t.device)) for t in inputs))
        reason = self._why_eager(full_key, inputs)
        if not self.enabled or reason:
            if reason and full_key not in self.fallback_reasons:
                self.fallback_reasons[full_key] = reason
            return self.eager(fn, inputs)
        entry = self.graphs.get(full_key)
        if entry is None:
            try:
                entry = self._capture(fn, inputs)
            except Exception as error:  # noqa: BLE001 - any capture failure means eager, with the reason
                self.fallback_reasons[full_key] = f"capture failed: {type(error).__name__}: {str(error)[:200]}"
                self.failed.append(self.fallback_reasons[full_key])
                try:  # a failed capture may leave an error on the stream: cleared here, not in fn's run
                    torch.cuda.synchronize()
                except Exception:  # noqa: BLE001
                    pass
                return self.eager(fn, inputs)
            if len(self.graphs) >= self.max_graphs:
                self.graphs.popitem(last=False)  # the least recently replayed
            self.graphs[full_key] = entry
            self.captures += 1
        self.graphs.move_to_end(full_key)
        for static, new in zip(entry.inputs, inputs):
            if static.data_ptr() != new.data_ptr():
                static.copy_(new)
        entry.graph.replay()
        self.replays += 1
        return self._join(tuple(t.clone() for t in entry.outputs), entry.aux)

    def _capture(self, fn: Callable, inputs) -> _Captured:
        static = tuple(t.detach().clone() for t in inputs)
        if self.emulate:
            for _ in range(self.warmup):
                self._split(fn(*static))
            with _Recorded() as graph:
                outputs, aux = self._split(fn(*static))
            return _Captured(graph, static, outputs, aux)
        side = torch.cuda.Stream(device=static[0].device)
        side.wait_stream(torch.cuda.current_stream(static[0].device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self._split(fn(*static))
        torch.cuda.current_stream(static[0].device).wait_stream(side)
        torch.cuda.synchronize(static[0].device)
        graph = torch.cuda.CUDAGraph()
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        with torch.cuda.graph(graph, pool=self._pool):
            outputs, aux = self._split(fn(*static))
        return _Captured(graph, static, outputs, aux)

    def stats(self) -> dict:
        return {"captures": self.captures, "replays": self.replays, "eager_calls": self.eager_calls,
                "graphs": len(self.graphs),
                "fallbacks": sorted({reason for reason in self.fallback_reasons.values()})}


class StaticSlots:
    """Fixed buffers a graph reads in place of one example's tensors, so that a graph captured
    for one example replays for every later one of the same shapes: ``bind(name, t)`` copies
    ``t`` into the buffer kept for (name, shape, dtype, device) and returns that buffer (one
    copy per example, before its passes: never inside a capture). Buffers live as long as the
    slots (a graph holds their addresses), one per name and shape."""

    def __init__(self) -> None:
        self.buffers: dict = {}

    def bind(self, name, tensor: torch.Tensor) -> torch.Tensor:
        key = (name, tuple(tensor.shape), tensor.dtype, str(tensor.device))
        slot = self.buffers.get(key)
        if slot is None:
            slot = self.buffers[key] = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        if slot is not tensor:
            slot.copy_(tensor)
        return slot

    def bind_tree(self, name, obj):
        """``bind`` every tensor of a tensor, tuple or list (named by its place); anything else as it is."""
        if isinstance(obj, torch.Tensor):
            return self.bind(name, obj)
        if isinstance(obj, (tuple, list)):
            return type(obj)(self.bind_tree((name, i), x) for i, x in enumerate(obj))
        return obj
