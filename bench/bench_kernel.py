"""Benchmark of the target-layer attribution op: fused CUDA kernel vs the PyTorch reference.

    python bench/bench_kernel.py                      # BERT-base shape, n = 128 .. 4096
    python bench/bench_kernel.py --ns 512 2048 --dtypes bf16 --maps no

For each dtype and sequence length it times ``attribution_from_grad`` (the reference
always materialises the per-head maps; the kernel is timed with and without them) and
records the peak GPU memory of one call above what the inputs already hold
(``torch.cuda.max_memory_allocated``), then prints one table with the ratios.
Needs a CUDA device; exits with a message otherwise.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attattr_cli.ops import kernel, reference  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--dim", type=int, default=64, help="head dim")
    parser.add_argument("--ns", type=int, nargs="+", default=[128, 512, 2048, 4096])
    parser.add_argument("--dtypes", nargs="+", default=["bf16", "fp32"], choices=sorted(DTYPES))
    parser.add_argument("--maps", choices=["both", "yes", "no"], default="both",
                        help="kernel runs with want_maps True, False or both")
    parser.add_argument("--mask", action="store_true", help="add a key-padding mask (a quarter padded)")
    parser.add_argument("--min-time", type=float, default=0.3, help="seconds of timed calls per cell")
    return parser.parse_args(argv)


def time_call(fn, min_time: float) -> float:
    """Median-free simple timing: mean milliseconds per call over >= min_time seconds."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    iters, total_ms = 1, 0.0
    while True:
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        total_ms = start.elapsed_time(end)
        if total_ms >= min_time * 1000 or iters >= 1 << 12:
            return total_ms / iters
        iters *= 2


def peak_bytes(fn) -> int:
    """Peak memory of one call above what was allocated before it."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - before
    del out
    return peak


def fmt_mib(n: int) -> str:
    return f"{n / 2**20:,.1f}"


def main(argv=None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernel: needs a CUDA device (torch.cuda.is_available() is False); nothing to do",
              file=sys.stderr)
        return 1
    if not kernel.available():
        print(f"bench_kernel: the CUDA kernels are unavailable: {kernel.unavailable_reason(hint=False)}",
              file=sys.stderr)
        return 1

    device = torch.device("cuda")
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    print(f"# {torch.cuda.get_device_name(device)} ({sms} SMs), torch {torch.__version__}, "
          f"batch {args.batch}, heads {args.heads}, d_head {args.dim}"
          f"{', key-padding mask' if args.mask else ''}")
    kernel_modes = {"both": [True, False], "yes": [True], "no": [False]}[args.maps]
    header = (f"{'dtype':>5} {'n':>6} {'maps':>5} | {'ref ms':>9} {'kern ms':>9} {'speedup':>8} | "
              f"{'ref MiB':>10} {'kern MiB':>10} {'mem ratio':>9} | {'blocks':>7}")
    print(header)
    print("-" * len(header))
    for dname in args.dtypes:
        dtype = DTYPES[dname]
        for n in args.ns:
            gen = torch.Generator(device=device).manual_seed(n)
            shape = (args.batch, args.heads, n, args.dim)
            q, k, v, g = (torch.randn(shape, generator=gen, device=device, dtype=dtype) for _ in range(4))
            pad = None
            if args.mask:
                pad = torch.zeros(args.batch, n, device=device)
                pad[:, n - n // 4:] = torch.finfo(torch.float32).min

            def ref_call():
                return reference.attribution_from_grad(
                    q, k, v, g, None if pad is None else pad[:, None, None, :], want_maps=True
                )

            try:
                ref_ms = time_call(ref_call, args.min_time)
                ref_mem = peak_bytes(ref_call)
            except torch.cuda.OutOfMemoryError:
                ref_ms, ref_mem = float("nan"), -1
                torch.cuda.empty_cache()
            blocks = kernel.attribution_grid(args.batch, args.heads, n, n, sms)["blocks"]
            for want_maps in kernel_modes:
                def kern_call(want_maps=want_maps):
                    return kernel.attribution_from_grad(q, k, v, g, pad, want_maps=want_maps)

                kern_ms = time_call(kern_call, args.min_time)
                kern_mem = peak_bytes(kern_call)
                speedup = ref_ms / kern_ms if kern_ms > 0 else float("nan")
                ratio = ref_mem / kern_mem if kern_mem > 0 and ref_mem >= 0 else float("nan")
                ref_mib = fmt_mib(ref_mem) if ref_mem >= 0 else "OOM"
                print(f"{dname:>5} {n:>6} {('yes' if want_maps else 'no'):>5} | {ref_ms:>9.3f} "
                      f"{kern_ms:>9.3f} {speedup:>7.2f}x | {ref_mib:>10} {fmt_mib(kern_mem):>10} "
                      f"{ratio:>8.2f}x | {blocks:>7}", flush=True)
            del q, k, v, g, pad
            torch.cuda.empty_cache()
    print("\nref = attattr_cli.ops.reference.attribution_from_grad (always builds the maps); "
          "kern = attattr_cli.ops.kernel.attribution_from_grad; speedup and mem ratio = ref / kern; "
          "blocks = the attribution kernel's grid (head groups x tiles x batch).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
