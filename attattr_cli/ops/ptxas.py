"""Registers, spills and shared memory of the CUDA kernels, from ``nvcc -Xptxas -v`` (only
``nvcc`` needed: no GPU, no CUDA build of PyTorch). The dynamic shared memory is not in ptxas's
log (it is chosen at launch); :func:`dynamic_smem` gives the launchers' figure.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ARCHS", "KernelUsage", "SM_LIMITS", "blocks_per_sm", "compile_report", "dynamic_smem", "parse",
           "summary_rows"]

ARCHS = ("80", "90")
THREADS = 256
# Per-SM limits: registers, shared memory usable by blocks (bytes), shared memory reserved
# by the system per block (bytes).  A100 (sm_80): 164 KB; H100 (sm_90): 228 KB.
SM_LIMITS = {"80": (65536, 164 * 1024, 1024), "90": (65536, 228 * 1024, 1024)}
_DTYPES = {"f": "float32", "6__half": "float16", "13__nv_bfloat16": "bfloat16"}


@dataclass(frozen=True)
class KernelUsage:
    """One compiled kernel on one architecture."""

    kernel: str  # attr_kernel, attn_fwd_kernel, attn_fwd_kernel+O, ...+mma, head_sum_reduce_kernel, ...
    dtype: str  # float32 / float16 / bfloat16, or "" for the reduction kernels
    head_dim: int  # 0 for the reduction kernels
    arch: str  # "80", "90"
    registers: int
    spill_stores: int
    spill_loads: int
    stack: int
    static_smem: int

    @property
    def spills(self) -> int:
        """Bytes spilled (the larger of the spill stores and loads)."""
        return max(self.spill_stores, self.spill_loads)


def compile_report(cu: Path, nvcc: str, archs=ARCHS, timeout: float = 1800) -> tuple[int, str]:
    """``(exit code, log)`` of ``nvcc -c -Xptxas -v`` on ``cu`` for ``archs`` (object discarded)."""
    gencode = [arg for arch in archs for arg in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
    cmd = [nvcc, "-c", "-std=c++17", "-O3", *gencode, "-Xptxas", "-v", str(cu), "-o", "/dev/null"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


def _describe(mangled: str) -> tuple[str, str, int]:
    for name in ("head_sum_reduce_kernel", "head_max_reduce_kernel", "key_sum_reduce_kernel"):
        if name in mangled:
            return name, "", 0
    match = re.search(
        r"(attr_kernel|attn_fwd_kernel)I(f|6__half|13__nv_bfloat16)Li(\d+)E(?:Lb([01])E)?(?:Lb([01])E)?", mangled
    )
    if match is None:
        return mangled, "", 0
    # attr_kernel<T, D, MMA, SPLIT_G, TG>; attn_fwd_kernel<T, D, WITH_O, MMA>
    if match.group(1) == "attr_kernel":
        with_o, mma, split = False, match.group(4) == "1", match.group(5) == "1"
    else:
        with_o, mma, split = match.group(4) == "1", match.group(5) == "1", False
    name = match.group(1) + ("+O" if with_o else "") + ("+mma" if mma else "") + ("+splitG" if split else "")
    return name, _DTYPES[match.group(2)], int(match.group(3))


def parse(log: str) -> list[KernelUsage]:
    """One :class:`KernelUsage` per ``Compiling entry function`` block of a ptxas log."""
    rows: list[KernelUsage] = []
    current: dict | None = None
    for line in log.splitlines():
        match = re.search(r"Compiling entry function '(\S+)' for 'sm_(\d+)a?'", line)
        if match:
            name, dtype, head_dim = _describe(match.group(1))
            current = {"kernel": name, "dtype": dtype, "head_dim": head_dim, "arch": match.group(2)}
            continue
        if current is None:
            continue
        match = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if match:
            current.update(stack=int(match.group(1)), spill_stores=int(match.group(2)), spill_loads=int(match.group(3)))
            continue
        match = re.search(r"Used (\d+) registers", line)
        if match:
            smem = re.search(r"(\d+) bytes smem", line)
            rows.append(KernelUsage(registers=int(match.group(1)), static_smem=int(smem.group(1)) if smem else 0,
                                    **{"spill_stores": 0, "spill_loads": 0, "stack": 0, **current}))
            current = None
    return rows


def dynamic_smem(kernel: str, head_dim: int) -> int:
    """Dynamic shared memory per block (bytes) the launchers ask for."""
    tiles = (64 + 64) * (head_dim + 1) * 4
    product = 64 * 65 * 4  # the tensor-core product tile (+mma), the forward's P (+O)
    if kernel == "attr_kernel":
        return tiles + (THREADS // 32) * 4
    if kernel in ("attr_kernel+mma", "attr_kernel+mma+splitG"):
        return tiles + (THREADS // 32) * 4 + product
    if kernel == "attn_fwd_kernel":
        return tiles
    if kernel in ("attn_fwd_kernel+O", "attn_fwd_kernel+mma", "attn_fwd_kernel+O+mma"):
        return tiles + product
    return 0


def blocks_per_sm(registers: int, smem: int, arch: str) -> tuple[int, int]:
    """``(by registers, by shared memory)``: resident 256-thread blocks per SM."""
    reg_file, smem_per_sm, reserved = SM_LIMITS[arch]
    per_thread = -(-max(registers, 1) // 8) * 8  # allocated in units of 8 per thread
    by_regs = reg_file // (per_thread * THREADS)
    by_smem = smem_per_sm // (smem + reserved) if smem else 32
    return by_regs, by_smem


def summary_rows(usages: list[KernelUsage]) -> list[dict]:
    """One row per (kernel, head dim, arch): max registers / spills over the dtypes."""
    groups: dict[tuple, list[KernelUsage]] = {}
    for usage in usages:
        groups.setdefault((usage.kernel, usage.head_dim, usage.arch), []).append(usage)
    rows = []
    for (kernel, head_dim, arch), members in sorted(groups.items()):
        registers = max(m.registers for m in members)
        smem = dynamic_smem(kernel, head_dim) + max(m.static_smem for m in members)
        by_regs, by_smem = blocks_per_sm(registers, smem, arch)
        rows.append({"kernel": kernel, "head_dim": head_dim, "arch": f"sm_{arch}", "registers": registers,
                     "spill_bytes": max(m.spills for m in members), "stack": max(m.stack for m in members),
                     "smem": smem, "blocks_by_regs": by_regs, "blocks_by_smem": by_smem})
    return rows
