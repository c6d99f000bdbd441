"""Build the attattr CUDA extension without a GPU, load it in a fresh process, check it.

Run with the Python of a CUDA build of PyTorch (``just kernel-link`` makes one in
``.venv-cuda``) and the repository on ``PYTHONPATH``:

    python kernels/link_check.py --arch "8.0 9.0"

Step 1 (this process): ``attattr_cli.ops.kernel.build(arch_list=...)``; prints the CUDA
toolkit it used and where the library went.  Step 2 (a fresh interpreter, so nothing of
the build is left in memory): ``torch.ops.load_library`` of that file, then checks that

* the three ops are registered with the expected schemas and have a CUDA kernel;
* their fake (meta) implementations are registered and give the right shapes and dtypes
  on meta tensors, and ``torch.library.opcheck`` passes on meta tensors;
* the launch plan exported by the library (``attattr_attr_plan``) agrees with
  ``kernel.attribution_grid`` and gives a 128-token BERT-base example >= 48 blocks.

Prints one summary line and exits 0 when everything holds, else the failures and 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

EXPECTED_SCHEMAS = {
    "attn_forward": (
        "attattr::attn_forward(Tensor q, Tensor k, Tensor v, Tensor? mask, float scale, "
        "bool causal, int stream=-1) -> (Tensor, Tensor)"
    ),
    "attr_from_grad": (
        "attattr::attr_from_grad(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask, "
        "Tensor? stats, float scale, bool causal, bool want_maps, int stream=-1) "
        "-> (Tensor, Tensor, Tensor)"
    ),
    "attr_key_sums": (
        "attattr::attr_key_sums(Tensor q, Tensor k, Tensor v, Tensor g, Tensor? mask, "
        "Tensor? stats, float scale, bool causal, int read_from, int stream=-1) -> (Tensor, Tensor)"
    ),
}


def check_library(library: str) -> dict:
    """Step 2, in a fresh process: load ``library`` and check the ops; returns a report."""
    import ctypes

    import torch

    from attattr_cli.ops import kernel

    failures: list[str] = []
    torch.ops.load_library(library)
    kernel._register_fakes(kernel.OP_NAMESPACE)
    ops = torch.ops.attattr
    for name, want in EXPECTED_SCHEMAS.items():
        schema = str(getattr(ops, name).default._schema)
        if schema != want:
            failures.append(f"{name} schema {schema!r} != {want!r}")
        for key in ("CUDA", "Meta"):
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"attattr::{name}", key):
                failures.append(f"{name} has no {key} kernel")

    # Fake implementations on meta tensors: shapes and dtypes.
    b, h, n_q, n_k, d = 2, 3, 70, 90, 64
    meta = {"device": "meta", "dtype": torch.bfloat16}
    q, g = torch.empty(b, h, n_q, d, **meta), torch.empty(b, h, n_q, d, **meta)
    k, v = torch.empty(b, h, n_k, d, **meta), torch.empty(b, h, n_k, d, **meta)
    mask = torch.zeros(b, n_k, device="meta")
    o, stats = ops.attn_forward(q, k, v, mask, 0.125, True)
    if (o.shape, o.dtype, stats.shape, stats.dtype) != (q.shape, q.dtype, (b, h, n_q, 2), torch.float32):
        failures.append(f"attn_forward fake gave {o.shape} {o.dtype}, {stats.shape} {stats.dtype}")
    for want_maps in (True, False):
        maps, head_sum, head_max = ops.attr_from_grad(q, k, v, g, mask, None, 0.125, False, want_maps)
        want = ((b, h, n_q, n_k) if want_maps else (0,), (b, n_q, n_k), (b, h))
        got = (tuple(maps.shape), tuple(head_sum.shape), tuple(head_max.shape))
        if got != want or {maps.dtype, head_sum.dtype, head_max.dtype} != {torch.float32}:
            failures.append(f"attr_from_grad fake (want_maps={want_maps}) gave {got}")

    key_sums, head_max = ops.attr_key_sums(q, k, v, g, mask, None, 0.125, True, 10)
    if (tuple(key_sums.shape), tuple(head_max.shape)) != ((b, 2, n_k), (b, h)):
        failures.append(f"attr_key_sums fake gave {tuple(key_sums.shape)}, {tuple(head_max.shape)}")

    opchecks = [
        (ops.attn_forward.default, (q, k, v, mask, 0.125, True, -1)),
        (ops.attr_from_grad.default, (q, k, v, g, mask, None, 0.125, False, True, -1)),
        (ops.attr_from_grad.default, (q, k, v, g, None, stats, 0.125, True, False, -1)),
        (ops.attr_key_sums.default, (q, k, v, g, mask, None, 0.125, True, 10, -1)),
    ]
    passed = 0
    for op, args in opchecks:
        try:
            torch.library.opcheck(op, args)
            passed += 1
        except Exception as error:  # noqa: BLE001 - reported, not raised
            failures.append(f"opcheck {op}: {str(error).splitlines()[0]}")

    # The launch plan compiled into the library against the Python mirror.
    lib = ctypes.CDLL(library)
    plans = []
    for n in (128, 512, 4096):
        per_group, workspace, partials = ctypes.c_int(), ctypes.c_longlong(), ctypes.c_longlong()
        code = lib.attattr_attr_plan(
            1, 12, n, n, 132, ctypes.byref(per_group), ctypes.byref(workspace), ctypes.byref(partials)
        )
        want = kernel.attribution_grid(1, 12, n, n, sms=132)
        if code != 0 or per_group.value != want["heads_per_group"]:
            failures.append(f"plan n={n}: code {code}, {per_group.value} heads per group, want {want}")
        plans.append((n, want["blocks"]))
    if plans[0][1] < 48:
        failures.append(f"BERT-base n=128 gives {plans[0][1]} attribution blocks (< 48)")
    return {
        "torch": torch.__version__,
        "failures": failures,
        "opcheck": f"{passed}/{len(opchecks)}",
        "grids": plans,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="8.0 9.0", help='architectures, e.g. "8.0 9.0"')
    parser.add_argument("--check-only", metavar="LIBRARY", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.check_only:
        print(json.dumps(check_library(args.check_only)))
        return 0

    from attattr_cli.errors import AttattrError
    from attattr_cli.ops import kernel

    toolkit = kernel.find_toolkit()
    print(f"toolkit: {toolkit.describe() if toolkit else 'none found'}", file=sys.stderr)
    start = time.monotonic()
    try:
        library = kernel.build(verbose=False, arch_list=args.arch)
    except AttattrError as error:
        print(f"kernel-link FAILED: {error}")
        return 1
    built = time.monotonic() - start
    print(f"library: {library} ({built:.0f} s)", file=sys.stderr)
    proc = subprocess.run(
        [sys.executable, __file__, "--check-only", str(library)], capture_output=True, text=True
    )
    if proc.returncode != 0 or not proc.stdout.strip():
        print(proc.stderr, file=sys.stderr)
        print(f"kernel-link FAILED: loading {library} in a fresh process failed (exit {proc.returncode})")
        return 1
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    for failure in report["failures"]:
        print(f"  {failure}", file=sys.stderr)
    grids = ", ".join(f"n={n}: {blocks}" for n, blocks in report["grids"])
    status = "OK" if not report["failures"] else f"FAILED ({len(report['failures'])} problems)"
    size = Path(library).stat().st_size / 1e6
    print(
        f"kernel-link {status}: torch {report['torch']}, {toolkit.root if toolkit else '?'}, "
        f"arch {kernel.normalize_arch_list(args.arch)}, {Path(library).name} {size:.2f} MB "
        f"loaded in a fresh process without a GPU; {len(EXPECTED_SCHEMAS)} ops with CUDA + Meta kernels and "
        f"the expected schemas; opcheck on meta {report['opcheck']}; "
        f"BERT-base attribution blocks on 132 SMs: {grids}"
    )
    return 0 if not report["failures"] else 1


if __name__ == "__main__":
    sys.exit(main())
