"""Benchmark of the target-layer attribution op: fused CUDA kernel vs the PyTorch reference vs SDPA flash backward.

    python bench/bench_kernel.py                      # BERT-base shape, n = 128 .. 16,384, bf16 and fp32
    python bench/bench_kernel.py --ns 512 2048 --dtypes bf16 --maps no
    python bench/bench_kernel.py --json k.json --launches 128 512 --budget 150   # what bench/gpu_all.sh runs
    python bench/bench_kernel.py --smoke --json /tmp/k.json   # CPU, tiny n: the table and JSON code, no kernel

For each sequence length and dtype it times ``attribution_from_grad`` of one layer
(12 heads, d = 64, batch 1 by default):

* dtypes ``bf16``, ``fp16``, ``fp32``: q, k, v and g in that dtype; ``bf16-g32``: bfloat16
  q, k, v with a float32 g (the engine's ``--dtype bfloat16`` scoring; the kernel's split path);
* ``ref``: ``attattr_cli.ops.reference`` (cuBLAS products, always builds the maps);
* ``kern``: the fused kernel with the maps kept, on its default path (tensor cores,
  ``mma.sync``, for float16 / bfloat16; CUDA-core fp32 FMAs for float32), and without the
  maps (``no maps``);
* ``fp32 path``: half inputs forced onto the CUDA-core path (``ATTATTR_TENSOR_CORES=0``), the
  kernel as it was before the tensor cores;
* ``sdpa bwd``: the backward of ``scaled_dot_product_attention`` on the flash backend (half
  dtypes only), the yardstick of a tuned attention kernel of similar work.

TFLOP/s count 4·B·H·n²·d for the attribution (its two products Q Kᵀ and G Vᵀ; the
kernel also recomputes Q Kᵀ for the softmax statistics, not counted) and 10·B·H·n²·d for the
flash backward (2.5x its forward's 4·B·H·n²·d, the usual convention). Memory is the peak of
one call above what the inputs hold (``torch.cuda.max_memory_allocated``).

``--launches 128 512`` also counts the CUDA kernels one example's scoring launches
(BERT-base, random init, m = 20, all layers; ``torch.profiler``) with ``--kernel cuda`` and
``--kernel torch``. ``--count-ops 128 512`` counts, on any device (the CPU too), the aten
ops one scored example runs (BERT-base's 12 layers and 12 heads, m = 20, all layers, the
widths narrowed: the ops of a pass depend on the graph of the model, not on its widths, and
the count is checked at two head dims), the ones that launch a CUDA kernel apart
(``attattr_cli.ops.graphs.OpCounter``; layers in sweeps up to the length a CUDA device
sweeps), those inside the integration passes, and the launches
left if each pass were one CUDA-graph replay (``ATTATTR_CUDA_GRAPHS=1``): a lower bound of
the launches without a GPU, and the host synchronisations, in all and inside the passes, with
the lines they come from (``--count-per-layer``: also with one pass per target layer).
``--budget S`` stops starting new cells after S seconds (the cells not run are listed). ``--json PATH`` writes every figure. One table is printed at the end.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.ops import kernel, reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16, "bf16-g32": torch.bfloat16}
# the dtype of g where it is not q's: bfloat16 q, k, v with a float32 integral (the engine's bf16 scoring)
G_DTYPES = {"bf16-g32": torch.float32}
DEFAULT_NS = [128, 256, 512, 1024, 2048, 4096, 8192, 16384]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64, help="head dim")
    parser.add_argument("--ns", type=int, nargs="+", default=None, help=f"default {DEFAULT_NS}")
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "bf16-g32", "fp32"], choices=sorted(DTYPES),
                        help="bf16-g32: bfloat16 q, k, v with a float32 g (the engine's bf16 scoring)")
    parser.add_argument("--maps", choices=["both", "yes", "no"], default="both",
                        help="kernel runs with want_maps True, False or both")
    parser.add_argument("--mask", action="store_true", help="add a key-padding mask (a quarter padded)")
    parser.add_argument("--min-time", type=float, default=0.15, help="seconds of timed calls per figure")
    parser.add_argument("--no-sdpa", action="store_true", help="skip the SDPA flash backward column")
    parser.add_argument("--launches", type=int, nargs="*", default=[],
                        help="count the CUDA kernels of one scored example at these lengths")
    parser.add_argument("--count-ops", type=int, nargs="*", default=[],
                        help="count the aten ops (kernel launches) of one scored example at these lengths; any device")
    parser.add_argument("--count-per-layer", action="store_true",
                        help="--count-ops also with one pass per target layer (no sweeps)")
    parser.add_argument("--count-graphs", action="store_true",
                        help="--count-ops also with the passes captured by a first example and replayed for the "
                             "counted one (ATTATTR_CUDA_GRAPHS=emulate on the CPU): a replay counts one launch")
    parser.add_argument("--count-group", type=int, default=0, metavar="G",
                        help="--count-ops also per example with G examples of the length sharing each pass "
                             "(score's default for encoder classifiers is 32)")
    parser.add_argument("--host-time", action="store_true",
                        help="time the host's work per scored example where the device's is negligible (6 tokens, "
                             "widths narrowed): inside the sweeps (what graphs replace) and outside them; any device")
    parser.add_argument("--count-steps", type=int, default=20, help="m for --count-ops / --launches")
    parser.add_argument("--graph-pass", type=int, nargs="*", default=[],
                        help="time one integration-like pass of BERT-base (forward + backward, batch m) at "
                             "these lengths, eager and as a CUDA-graph replay (attattr_cli.ops.graphs); CUDA only")
    parser.add_argument("--budget", type=float, default=0.0, help="seconds; 0: no limit")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--smoke", action="store_true",
                        help="CPU, n = 32 and 64, no kernel: checks the table and JSON code anywhere")
    return parser.parse_args(argv)


# ------------------------------------------------------------------ timing
def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_call(fn, min_time: float, device: torch.device) -> float:
    """Mean milliseconds per call over >= min_time seconds (one warm-up call when a call is
    long, three otherwise)."""
    t0 = time.perf_counter()
    fn()
    sync(device)
    if time.perf_counter() - t0 < 0.05:
        for _ in range(2):
            fn()
        sync(device)
    iters = 1
    while True:
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(iters):
                fn()
            end.record()
            torch.cuda.synchronize()
            total_ms = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            total_ms = 1e3 * (time.perf_counter() - t0)
        if total_ms >= min_time * 1000 or iters >= 1 << 12:
            return total_ms / iters
        iters *= 2


def peak_mib(fn, device: torch.device) -> float | None:
    """Peak memory (MiB) of one call above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak / 2**20


@contextmanager
def tensor_cores(on: bool):
    """The binding reads ATTATTR_TENSOR_CORES at every call."""
    old = os.environ.get("ATTATTR_TENSOR_CORES")
    os.environ["ATTATTR_TENSOR_CORES"] = "1" if on else "0"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("ATTATTR_TENSOR_CORES", None)
        else:
            os.environ["ATTATTR_TENSOR_CORES"] = old


def guarded(fn):
    """fn() or None when the device runs out of memory."""
    try:
        return fn()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None


# ------------------------------------------------------------------ one cell
def measure_cell(args, dname: str, n: int, device: torch.device, with_kernel: bool) -> dict:
    dtype = DTYPES[dname]
    b, h, d = args.batch, args.heads, args.dim
    gen = torch.Generator(device=device).manual_seed(n)
    shape = (b, h, n, d)
    q, k, v, g = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
    if dname in G_DTYPES:
        g = g.to(G_DTYPES[dname])
    pad = None
    if args.mask:
        pad = torch.zeros(b, n, device=device)
        pad[:, n - n // 4:] = torch.finfo(torch.float32).min
    row: dict = {"dtype": dname, "n": n, "batch": b, "heads": h, "dim": d,
                 "attr_flops": 4 * b * h * n * n * d, "sdpa_bwd_flops": 10 * b * h * n * n * d}

    def ref_call():
        return reference.attribution_from_grad(q, k, v, g, None if pad is None else pad[:, None, None, :],
                                               want_maps=True)

    row["ref_ms"] = guarded(lambda: time_call(ref_call, args.min_time, device))
    row["ref_mib"] = guarded(lambda: peak_mib(ref_call, device)) if row["ref_ms"] is not None else None

    if with_kernel:
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        row["blocks"] = kernel.attribution_grid(b, h, n, n, sms)["blocks"]
        modes = {"both": [True, False], "yes": [True], "no": [False]}[args.maps]
        for want_maps in modes:
            key = "kern" if want_maps else "kern_nomaps"

            def kern_call(want_maps=want_maps):
                return kernel.attribution_from_grad(q, k, v, g, pad, want_maps=want_maps)

            with tensor_cores(True):
                row[f"{key}_ms"] = guarded(lambda: time_call(kern_call, args.min_time, device))
                row[f"{key}_mib"] = guarded(lambda: peak_mib(kern_call, device))
        if dtype != torch.float32:
            with tensor_cores(False):
                row["kern_fp32path_ms"] = guarded(
                    lambda: time_call(lambda: kernel.attribution_from_grad(q, k, v, g, pad, want_maps=modes[0]),
                                      args.min_time, device))
            # the two paths agree to float rounding (a cheap check on real hardware)
            with tensor_cores(True):
                fast = kernel.attribution_from_grad(q, k, v, g, pad, want_maps=False)["head_sum"]
            with tensor_cores(False):
                slow = kernel.attribution_from_grad(q, k, v, g, pad, want_maps=False)["head_sum"]
            scale = slow.abs().max().item() or 1.0
            row["paths_max_rel_diff"] = (fast - slow).abs().max().item() / scale
            del fast, slow

    if not args.no_sdpa and dtype != torch.float32:
        row["sdpa_bwd_ms"] = guarded(lambda: sdpa_backward_ms(q, k, v, pad, args.min_time, device))
    del q, k, v, g, pad
    if device.type == "cuda":
        torch.cuda.empty_cache()
    for key, flops in (("ref", "attr_flops"), ("kern", "attr_flops"), ("kern_nomaps", "attr_flops"),
                       ("kern_fp32path", "attr_flops"), ("sdpa_bwd", "sdpa_bwd_flops")):
        ms = row.get(f"{key}_ms")
        if ms:
            row[f"{key}_tflops"] = row[flops] / (ms * 1e-3) / 1e12
    return row


def sdpa_backward_ms(q, k, v, pad, min_time: float, device: torch.device) -> float:
    """Milliseconds of one backward of scaled_dot_product_attention (flash backend on CUDA)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qs, ks, vs = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    backend = SDPBackend.FLASH_ATTENTION if device.type == "cuda" else SDPBackend.MATH
    with sdpa_kernel(backend):
        # flash takes no additive mask; the padding changes little of the work
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs)
        do = torch.randn_like(o)
        return time_call(lambda: torch.autograd.grad(o, (qs, ks, vs), do, retain_graph=True), min_time, device)


# ------------------------------------------------------------------ launches
def count_launches(ns: list[int], dtype_name: str, steps: int = 20) -> list[dict]:
    """CUDA kernels (and copies) one scored BERT-base example launches, by torch.profiler."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "tests"))
    from bench_gpu_score import bert_base  # noqa: E402

    from attattr_cli.data.types import Example
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    loaded = bert_base(torch.device("cuda"), getattr(torch, dtype_name))
    rows = []
    for n in ns:
        example = Example(0, " ".join(f"w{i % 1000}" for i in range(n - 2)))
        for kind in ("cuda", "torch"):
            scorer = Scorer(loaded, ScoreOptions(steps=steps, dtype=dtype_name, kernel=kind))
            scorer.score(example)  # warm-up
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                scorer.score(example)
                torch.cuda.synchronize()
            seconds = time.perf_counter() - t0
            kernels = copies = 0
            for event in prof.key_averages():
                if event.device_type != DeviceType.CUDA:
                    continue
                if event.key.startswith(("Memcpy", "Memset")):
                    copies += event.count
                else:
                    kernels += event.count
            rows.append({"n": n, "kernel": kind, "steps": steps, "dtype": dtype_name,
                         "kernel_launches": kernels, "copies": copies, "profiled_seconds": seconds})
            print(f"# launches: n = {n}, --kernel {kind}: {kernels} kernels, {copies} copies/memsets "
                  f"({seconds:.2f} s under the profiler)", flush=True)
    return rows


def narrow_bert(device, head_dim: int, max_n: int):
    """BERT-base's graph (12 layers, 12 heads, GELU, layer norms, a 3-way head) at head dim
    ``head_dim`` instead of 64, random init, with bench_gpu_score's tokenizer."""
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from attattr_cli.models.loading import prepare

    torch.manual_seed(0)
    hidden = 12 * head_dim
    cfg = BertConfig(num_hidden_layers=12, num_attention_heads=12, hidden_size=hidden,
                     intermediate_size=4 * hidden, num_labels=3, max_position_embeddings=max(512, max_n + 2))
    model = BertForSequenceClassification(cfg).to(device).eval()
    vocab = ROOT / "bench" / ".vocab.txt"
    if not vocab.exists():
        vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1000)]))
    tok = BertTokenizerFast(str(vocab), model_max_length=max(512, max_n + 2))
    return prepare(model, tok, f"bert-base graph, head dim {head_dim} (random init)")


def count_ops(ns: list[int], steps: int = 20, head_dims=(4, 8), device=None, step_batch: int | None = None,
              sweeps: bool = True, graphs: bool = False) -> list[dict]:
    """Aten ops of one scored example (see the module docstring), by OpCounter: all, those that
    launch a kernel on a GPU, the host synchronisations, those inside the integration passes
    (Scorer._step_chunk) and the attribution (Scorer.attribute), and the launches left with
    one CUDA-graph replay per pass. The first head dim is reported, the others' counts beside.
    ``step_batch`` (default: every row of a pass at once, as on a large GPU) fixes the micro-batches,
    which otherwise follow the free memory and the model's width. ``sweeps=False``: one pass per
    target layer (the CPU's choice above 256 tokens). Host syncs are counted inside the passes
    and in all, with the places in attattr's code they come from (``sync_sites``). ``graphs``:
    with the passes captured (ATTATTR_CUDA_GRAPHS=emulate on the CPU, =1 on a GPU) by the
    warm-up example and replayed for the counted one (other words, the same length): each
    replay counts one launch (``launches_replayed``; the inputs' and outputs' copies and the
    static slots' count as the ops they are)."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine import sweep
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.ops import graphs as graph_ops
    from attattr_cli.ops.graphs import OpCounter

    device = device or torch.device("cpu")
    step_batch = step_batch or 12 * steps  # all layers' rows of a sweep in one micro-batch
    rows = []
    for n in ns:
        per_dim = {}
        for head_dim in head_dims:
            loaded = narrow_bert(device, head_dim, n)
            example = Example(0, " ".join(f"w{i % 1000}" for i in range(n - 2)))
            other = Example(1, " ".join(f"w{(i * 37 + 11) % 1000}" for i in range(n - 2)))
            mode = os.environ.get(graph_ops.ENV_VAR)
            if graphs:
                os.environ[graph_ops.ENV_VAR] = "1" if device.type == "cuda" else "emulate"
            scorer = Scorer(loaded, ScoreOptions(steps=steps, kernel="torch", step_batch=step_batch))
            scorer.sweep = sweeps
            cpu_max = sweep.MAX_TOKENS
            sweep.MAX_TOKENS = getattr(sweep, "CUDA_MAX_TOKENS", cpu_max)  # the passes a CUDA device runs
            try:
                scorer.score(other if graphs else example)  # warm-up (lazy set-up, caches; with graphs: the capture)
            finally:
                sweep.MAX_TOKENS = cpu_max
            counter = OpCounter(where=True)
            replay = graph_ops._Recorded.replay

            def replayed(recorded, _replay=replay):
                with counter.region("replay"):
                    return _replay(recorded)

            graph_ops._Recorded.replay = replayed

            # the regions, where the engine has them: a pass of one layer, a sweep over all layers
            # (engine/sweep.py), the attribution from G
            targets = [(scorer, "_step_chunk", "pass"), (sweep, "_pass", "pass"),
                       (sweep, "shared_pass", "pass"), (scorer, "attribute", "attribute")]
            restore = []
            for owner, name, region in targets:
                method = getattr(owner, name, None)
                if method is None:
                    continue

                def wrapped(*a, _method=method, _region=region, **k):
                    with counter.region(_region):
                        return _method(*a, **k)

                restore.append((owner, name, method))
                setattr(owner, name, wrapped)
            t0 = time.perf_counter()
            sweep.MAX_TOKENS = getattr(sweep, "CUDA_MAX_TOKENS", cpu_max)  # the passes a CUDA device runs
            try:
                with counter:
                    scorer.score(example)
            finally:
                graph_ops._Recorded.replay = replay
                if mode is None:
                    os.environ.pop(graph_ops.ENV_VAR, None)
                else:
                    os.environ[graph_ops.ENV_VAR] = mode
                sweep.MAX_TOKENS = cpu_max
                for owner, name, method in restore:
                    if owner is scorer:
                        delattr(scorer, name)
                    else:
                        setattr(owner, name, method)
            passes = counter.entries["pass"]
            in_passes = counter.regions.get("pass")
            launching = counter.all.launching
            row = {
                "n": n, "steps": steps, "head_dim": head_dim, "device": str(device), "sweeps": sweeps,
                "ops": counter.all.total, "launching_ops": launching, "syncs": counter.all.syncs,
                "passes": passes, "pass_launching_ops": in_passes.launching if in_passes else None,
                "pass_syncs": in_passes.syncs if in_passes else None,
                "sync_sites": dict(counter.all.sync_sites.most_common()),
                "pass_sync_sites": dict(in_passes.sync_sites.most_common()) if in_passes else {},
                "attribution_launching_ops": counter.regions["attribute"].launching if "attribute" in counter.regions else None,
                "launches_with_graphs": (launching - in_passes.launching + passes) if in_passes else None,
                "graphs": graphs,
                "replays": counter.entries["replay"],
                "launches_replayed": (launching - counter.regions["replay"].launching + counter.entries["replay"])
                if "replay" in counter.regions else None,
                "top_ops": counter.all.as_dict(8)["top"], "seconds": time.perf_counter() - t0,
            }
            per_dim[head_dim] = row
        first = per_dim[head_dims[0]]
        first["launching_ops_at_head_dims"] = {str(d): per_dim[d]["launching_ops"] for d in head_dims}
        first["passes_at_head_dims"] = {str(d): per_dim[d]["passes"] for d in head_dims}
        rows.append(first)
        print(f"# ops: n = {n}, m = {steps}{'' if sweeps else ', one pass per layer'}: {first['launching_ops']:,} "
              f"kernel-launching ops of {first['ops']:,} ({first['syncs']} host syncs, {first['pass_syncs']} inside "
              f"passes), {first['passes']} integration passes holding "
              f"{first['pass_launching_ops']}; with one graph replay per pass: {first['launches_with_graphs']} "
              f"launches{'' if first['launches_replayed'] is None else ' (counted with graphs replayed: ' + format(first['launches_replayed'], ',') + ' launching ops, ' + str(first['replays']) + ' replays)'}; "
              f"launching ops at head dims {first['launching_ops_at_head_dims']} "
              f"({first['seconds']:.1f} s)", flush=True)
    return rows


def count_group_ops(ns: list[int], group: int, steps: int = 20, head_dim: int = 4) -> list[dict]:
    """Aten ops per example when ``group`` examples of one length share each pass (what `attattr
    score` does by default for an encoder classifier, engine/grouped.py), the same narrowed
    BERT-base graph as :func:`count_ops`: the group's counts divided by its size."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine import grouped
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.ops.graphs import OpCounter

    rows = []
    for n in ns:
        loaded = narrow_bert(torch.device("cpu"), head_dim, n)
        scorer = Scorer(loaded, ScoreOptions(steps=steps, kernel="torch", group=group))
        examples = [Example(i, " ".join(f"w{(i * 37 + j) % 1000}" for j in range(n - 2))) for i in range(group)]
        encs = [scorer.encode(e) for e in examples]
        grouped.score_group(scorer, examples, encs)  # warm-up
        counter = OpCounter()
        t0 = time.perf_counter()
        with counter:
            grouped.score_group(scorer, examples, encs)
        row = {"n": n, "steps": steps, "group": group, "launching_ops_per_example": counter.all.launching / group,
               "syncs_per_example": counter.all.syncs / group, "seconds": time.perf_counter() - t0}
        rows.append(row)
        print(f"# ops: n = {n}, m = {steps}, groups of {group}: {row['launching_ops_per_example']:,.0f} kernel-launching "
              f"ops and {row['syncs_per_example']:.1f} host syncs per example ({row['seconds']:.1f} s)", flush=True)
    return rows


def host_time(n: int = 6, steps: int = 20, repeat: int = 5) -> dict:
    """The host's time per scored example where the device's work is negligible (BERT-base's
    graph narrowed to head dim 4, ``n`` tokens, m = ``steps``, all layers swept as on a CUDA
    device, one thread): in all, inside the sweeps (what CUDA graphs replace by one launch
    each) and outside them (what is left with graphs: the clean forward and backward, the
    layers' bookkeeping)."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine import sweep
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    loaded = narrow_bert(torch.device("cpu"), 4, n)
    scorer = Scorer(loaded, ScoreOptions(steps=steps, kernel="torch", step_batch=12 * steps))
    examples = [Example(i, " ".join(f"w{(i * 37 + j) % 1000}" for j in range(n - 2))) for i in range(repeat + 1)]
    inside = [0.0]
    original, cpu_max = sweep._pass, sweep.MAX_TOKENS

    def timed_pass(*a, **k):
        t0 = time.perf_counter()
        try:
            return original(*a, **k)
        finally:
            inside[0] += time.perf_counter() - t0

    sweep._pass, sweep.MAX_TOKENS = timed_pass, sweep.CUDA_MAX_TOKENS
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        scorer.score(examples[-1])  # warm-up
        inside[0] = 0.0
        t0 = time.perf_counter()
        for example in examples[:repeat]:
            scorer.score(example)
        total = (time.perf_counter() - t0) / repeat
    finally:
        sweep._pass, sweep.MAX_TOKENS = original, cpu_max
        torch.set_num_threads(threads)
    row = {"n": n, "steps": steps, "ms_per_example": 1e3 * total, "ms_in_sweeps": 1e3 * inside[0] / repeat,
           "ms_outside_sweeps": 1e3 * (total - inside[0] / repeat)}
    print(f"# host time per example (n = {n}, head dim 4, m = {steps}, one thread): {row['ms_per_example']:.1f} ms, "
          f"{row['ms_in_sweeps']:.1f} in the two sweeps, {row['ms_outside_sweeps']:.1f} outside them", flush=True)
    return row


def graph_pass(ns: list[int], steps: int = 20, dtype=torch.bfloat16, min_time: float = 0.3) -> list[dict]:
    """One integration-like pass of BERT-base (random init): the forward of m scaled copies of
    the embeddings and the backward to them, eager and captured once / replayed with
    ``CapturedPass``; ms per pass, CUDA kernels per pass (torch.profiler) and the largest
    difference of the gradients."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile
    from transformers import BertConfig, BertForSequenceClassification

    from attattr_cli.ops.graphs import CapturedPass

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(num_labels=3)).to(device=device, dtype=dtype).eval()
    rows = []
    for n in ns:
        emb = torch.randn(1, n, 768, device=device, dtype=dtype)
        alphas = torch.linspace(0.05, 1, steps, device=device, dtype=dtype)

        def one_pass(emb, alphas):
            x = (emb * alphas.view(-1, 1, 1)).detach().requires_grad_(True)
            with torch.enable_grad():
                f = model(inputs_embeds=x).logits[:, 0].float()
                (g,) = torch.autograd.grad(f.sum(), x)
            return g.float().sum(0), f.detach()

        captured = CapturedPass(enabled=True)
        graphed = lambda: captured.run("pass", one_pass, emb, alphas)  # noqa: E731
        eager = lambda: one_pass(emb, alphas)  # noqa: E731
        want, got = eager(), graphed()
        row = {"n": n, "steps": steps, "dtype": str(dtype).split(".")[-1],
               "max_abs_diff": float((want[0] - got[0]).abs().max())}
        for name, fn in (("eager", eager), ("graph", graphed)):
            row[f"{name}_ms"] = time_call(fn, min_time, device) * 1e3
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                fn()
                torch.cuda.synchronize()
            row[f"{name}_kernels"] = sum(e.count for e in prof.key_averages() if e.device_type == DeviceType.CUDA)
        row["graph_stats"] = captured.stats()
        rows.append(row)
        print(f"# graph pass: n = {n}, m = {steps}: eager {row['eager_ms']:.2f} ms ({row['eager_kernels']} kernels), "
              f"graph replay {row['graph_ms']:.2f} ms ({row['graph_kernels']} kernels), |diff| {row['max_abs_diff']:.2g}; "
              f"{captured.stats()}", flush=True)
    return rows


# ------------------------------------------------------------------ output
def fmt(x, spec=".3f", none="-") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return none
    return format(x, spec)


def table(rows: list[dict], launches: list[dict], skipped: list[str], ops: list[dict] | None = None) -> str:
    head = (f"{'dtype':>8} {'n':>6} | {'ref ms':>9} {'kern ms':>9} {'no maps':>9} {'fp32 path':>9} "
            f"{'sdpa bwd':>9} | {'ref':>6} {'kern':>6} {'fp32p':>6} {'sdpa':>6} | {'ref/kern':>8} | "
            f"{'ref MiB':>9} {'kern MiB':>9} {'no maps':>8}")
    lines = [f"{'':16}| {'time per call (ms)':^49} | {'TFLOP/s':^27} | {'':8} | {'peak memory':^28}", head,
             "-" * len(head)]
    for r in rows:
        ratio = r["ref_ms"] / r["kern_ms"] if r.get("ref_ms") and r.get("kern_ms") else None
        lines.append(
            f"{r['dtype']:>8} {r['n']:>6} | {fmt(r.get('ref_ms'), '9.3f', 'OOM'):>9} "
            f"{fmt(r.get('kern_ms'), '9.3f'):>9} {fmt(r.get('kern_nomaps_ms'), '9.3f'):>9} "
            f"{fmt(r.get('kern_fp32path_ms'), '9.3f'):>9} {fmt(r.get('sdpa_bwd_ms'), '9.3f'):>9} | "
            f"{fmt(r.get('ref_tflops'), '6.1f'):>6} {fmt(r.get('kern_tflops'), '6.1f'):>6} "
            f"{fmt(r.get('kern_fp32path_tflops'), '6.1f'):>6} {fmt(r.get('sdpa_bwd_tflops'), '6.1f'):>6} | "
            f"{fmt(ratio, '7.2f') + 'x' if ratio else '-':>8} | {fmt(r.get('ref_mib'), ',.1f'):>9} "
            f"{fmt(r.get('kern_mib'), ',.1f'):>9} {fmt(r.get('kern_nomaps_mib'), ',.1f'):>8}")
    for item in skipped:
        lines.append(f"  not run (budget): {item}")
    for r in ops or []:
        lines.append("")
        if "group" in r:
            lines.append(f"aten ops per scored example (BERT-base graph, m = {r['steps']}, all layers; any device): "
                         f"n = {r['n']}, groups of {r['group']}: {r['launching_ops_per_example']:,.0f} that launch "
                         f"kernels, {r['syncs_per_example']:.1f} host syncs")
            continue
        replayed = "" if r.get("launches_replayed") is None else (
            f"; counted with the passes replayed (graphs emulated): {r['launches_replayed']:,}")
        lines.append(f"aten ops per scored example (BERT-base graph, m = {r['steps']}, all layers; any device): "
                     f"n = {r['n']}{'' if r.get('sweeps', True) else ' (one pass per layer)'}: {r['launching_ops']:,} "
                     f"that launch kernels ({r['ops']:,} in all, {r['syncs']} host syncs, "
                     f"{r.get('pass_syncs')} inside passes), {r['passes']} passes holding {r['pass_launching_ops']}; "
                     f"one graph replay per pass would leave {r['launches_with_graphs']}{replayed}")
    if launches:
        lines.append("")
        lines.append("CUDA kernels launched per scored example (BERT-base, m = 20, all layers):")
        for r in launches:
            lines.append(f"  n = {r['n']:>5}  --kernel {r['kernel']:<5} {r['kernel_launches']:>7,} kernels "
                         f"{r['copies']:>6,} copies/memsets")
    lines.append("")
    lines.append("kern = the default path (tensor cores for bf16/fp16, CUDA cores for fp32), maps kept; "
                 "fp32 path = ATTATTR_TENSOR_CORES=0; sdpa bwd = flash backward of "
                 "scaled_dot_product_attention; TFLOP/s: 4·B·H·n²·d for the attribution, 10·B·H·n²·d for "
                 "the flash backward.")
    return "\n".join(lines)


def machine(device: torch.device) -> dict:
    info = {"torch": torch.__version__, "cuda": torch.version.cuda, "python": platform.python_version(),
            "device": device.type}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(gpu=torch.cuda.get_device_name(device), sms=props.multi_processor_count,
                    capability=f"{props.major}.{props.minor}")
    return info


def main(argv=None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    if args.smoke or ((args.count_ops or args.host_time) and not torch.cuda.is_available()):
        device = torch.device("cpu")
        # --count-ops on a machine without a GPU (and no --smoke): only the counts
        ns = (args.ns or [32, 64]) if args.smoke else []
        with_kernel = False
    else:
        if not torch.cuda.is_available():
            print("bench_kernel: needs a CUDA device (torch.cuda.is_available() is False); "
                  "--smoke runs the CPU check", file=sys.stderr)
            return 1
        if not kernel.available():
            print(f"bench_kernel: the CUDA kernels are unavailable: {kernel.unavailable_reason(hint=False)}",
                  file=sys.stderr)
            return 1
        device = torch.device("cuda")
        ns = args.ns or DEFAULT_NS
        with_kernel = True
    info = machine(device)
    print(f"# {info.get('gpu', 'cpu')} ({info.get('sms', '-')} SMs), torch {torch.__version__}, batch "
          f"{args.batch}, heads {args.heads}, d_head {args.dim}{', key-padding mask' if args.mask else ''}",
          flush=True)
    rows, skipped = [], []
    for n in ns:
        for dname in args.dtypes:
            if args.budget and time.perf_counter() - start > args.budget:
                skipped.append(f"{dname} n={n}")
                continue
            t0 = time.perf_counter()
            row = measure_cell(args, dname, n, device, with_kernel)
            row["cell_seconds"] = time.perf_counter() - t0
            rows.append(row)
            print(f"# {dname} n={n}: ref {fmt(row.get('ref_ms'), '.3f', 'OOM')} ms, kernel "
                  f"{fmt(row.get('kern_ms'))} ms, fp32 path {fmt(row.get('kern_fp32path_ms'))} ms, "
                  f"sdpa bwd {fmt(row.get('sdpa_bwd_ms'))} ms ({row['cell_seconds']:.1f} s)", flush=True)
    ops = count_ops(args.count_ops, args.count_steps) if args.count_ops else []
    if args.count_ops and args.count_per_layer:
        ops += count_ops(args.count_ops, args.count_steps, sweeps=False)
    if args.count_ops and args.count_group:
        ops += count_group_ops(args.count_ops, args.count_group, args.count_steps)
    if args.count_ops and args.count_graphs:
        # at the shortest length only on the CPU: an emulated graph keeps every intermediate of its
        # capture (14 GB at 512 tokens), and the counts follow the passes, not the length
        graph_ns = args.count_ops if device.type == "cuda" else [min(args.count_ops)]
        ops += count_ops(graph_ns, args.count_steps, graphs=True)
        if args.count_per_layer:
            ops += count_ops(graph_ns, args.count_steps, sweeps=False, graphs=True)
    host = host_time(steps=args.count_steps) if args.host_time else None
    passes = []
    if args.graph_pass:
        if device.type != "cuda":
            print("# graph pass: needs a CUDA device; not measured", flush=True)
        else:
            passes = graph_pass(args.graph_pass, args.count_steps)
    launches = []
    if args.launches:
        if device.type != "cuda":
            print("# launches: needs a CUDA device; not counted", flush=True)
        elif args.budget and time.perf_counter() - start > args.budget:
            skipped.append(f"launches at {args.launches}")
        else:
            launches = count_launches(args.launches, "bfloat16", args.count_steps)
    text = table(rows, launches, skipped, ops)
    print()
    print(text)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {"machine": info, "config": {k: (str(v) if isinstance(v, Path) else v)
                                               for k, v in vars(args).items()},
                   "rows": rows, "launches": launches, "ops": ops, "graph_pass": passes, "host_time": host,
                   "skipped": skipped,
                   "seconds": time.perf_counter() - start, "table": text}
        args.json.write_text(json.dumps(payload, indent=1))
        print(f"\n# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
