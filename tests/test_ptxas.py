"""ptxas resource check of the CUDA kernels (needs nvcc only, no GPU, no CUDA PyTorch).

``nvcc -c -Xptxas -v`` of attattr_cli/kernels/attattr_attn.cu for sm_80 and sm_90, one
compile per architecture, side by side (about 11 s on 2 cores; 22 s as one compile of
both; twice that since the tensor-core variants): it must compile without warnings, and every kernel, dtype and head dim must have
no spill and a register count that lets at least two 256-thread blocks share an SM
(<= 128 registers).  kernels/README.md holds the table
(``python kernels/ptxas_table.py`` prints it).

``nvcc -ptx`` for sm_80 and sm_90a: the PTX of the tensor-core attribution and forward
kernels holds ``mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}`` and the fp32 path's
kernels hold none.
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from attattr_cli.ops import kernel, ptxas

ROOT = Path(__file__).resolve().parents[1]
CU = ROOT / "attattr_cli" / "kernels" / "attattr_attn.cu"

LOG_SAMPLE = """\
ptxas info    : Compiling entry function '_ZN7attattr12_GLOBAL__N_115attn_fwd_kernelIfLi64ELb1EEEvPKT_' for 'sm_90'
ptxas info    : Function properties for _ZN7attattr12_GLOBAL__N_115attn_fwd_kernelIfLi64ELb1EEEvPKT_
    16 bytes stack frame, 16 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 552 bytes cmem[0]
ptxas info    : Compiling entry function '_ZN7attattr12_GLOBAL__N_111attr_kernelI13__nv_bfloat16Li128EEEvPKT_' for 'sm_80'
ptxas info    : Function properties for _ZN7attattr12_GLOBAL__N_111attr_kernelI13__nv_bfloat16Li128EEEvPKT_
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 127 registers, used 1 barriers, 32 bytes smem, 552 bytes cmem[0]
"""


def test_parse_a_ptxas_log():
    rows = ptxas.parse(LOG_SAMPLE)
    assert [(r.kernel, r.dtype, r.head_dim, r.arch) for r in rows] == [
        ("attn_fwd_kernel+O", "float32", 64, "90"),
        ("attr_kernel", "bfloat16", 128, "80"),
    ]
    assert (rows[0].registers, rows[0].spills, rows[0].stack) == (64, 16, 16)
    assert (rows[1].registers, rows[1].spills, rows[1].static_smem) == (127, 0, 32)
    summary = ptxas.summary_rows(rows)
    assert summary[1]["smem"] == (128 * 129 + 8) * 4 + 32


def test_blocks_per_sm():
    assert ptxas.blocks_per_sm(128, 0, "80")[0] == 2  # 128 x 256 x 2 = 65536 registers
    assert ptxas.blocks_per_sm(129, 0, "80")[0] == 1  # rounded up to 136 per thread
    assert ptxas.blocks_per_sm(64, 0, "90")[0] == 4
    # 82,688 bytes of shared memory: 2 blocks on an A100 (164 KB), 2 on an H100 (228 KB)
    assert ptxas.blocks_per_sm(116, 82688, "80") == (2, 2)
    assert ptxas.blocks_per_sm(116, 82688, "90") == (2, 2)


@pytest.fixture(scope="module")
def usage():
    toolkit = kernel.find_toolkit()
    if toolkit is None:
        pytest.skip("nvcc not found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda): no ptxas check")

    def compile_for(arch):
        return ptxas.compile_report(CU, str(toolkit.nvcc), archs=(arch,))

    with ThreadPoolExecutor(len(ptxas.ARCHS)) as pool:
        reports = list(pool.map(compile_for, ptxas.ARCHS))
    for arch, (code, log) in zip(ptxas.ARCHS, reports):
        assert code == 0, f"nvcc failed for sm_{arch}:\n{log}"
    log = "".join(log for _, log in reports)
    return log, ptxas.parse(log)


def test_compiles_without_warnings(usage):
    log, _ = usage
    assert "warning" not in log.lower(), log


def test_no_spills_and_two_blocks_per_sm(usage):
    _, rows = usage
    kernels = {(r.kernel, r.dtype, r.head_dim, r.arch) for r in rows}
    # 3 dtypes x 4 head dims x (attr, fwd, fwd+O), the tensor-core variants of the two half
    # dtypes (attr+mma, fwd+mma, fwd+O+mma), bfloat16's attr+mma+splitG (float32 G) and 3
    # reductions (head sums, head maxima, per-key sums), for each architecture
    assert len(kernels) == 2 * (3 * 4 * 3 + 2 * 4 * 3 + 4 + 3), sorted(kernels)
    spilled = [r for r in rows if r.spills or r.stack]
    assert not spilled, "spills: " + "; ".join(
        f"{r.kernel} {r.dtype} D={r.head_dim} sm_{r.arch}: {r.spills} bytes" for r in spilled
    )
    crowded = [r for r in rows if ptxas.blocks_per_sm(r.registers, 0, r.arch)[0] < 2]
    assert not crowded, "fewer than 2 blocks per SM by registers: " + "; ".join(
        f"{r.kernel} {r.dtype} D={r.head_dim} sm_{r.arch}: {r.registers} registers" for r in crowded
    )


def test_readme_table_is_current(usage):
    """kernels/README.md's table is the one this compiler prints (registers may drift
    with the nvcc version, so only the kernel rows, spills and shared memory are compared)."""
    _, rows = usage
    readme = (ROOT / "kernels" / "README.md").read_text()
    for row in ptxas.summary_rows(rows):
        prefix = f"| {row['kernel']} | {row['head_dim'] or '-'} | {row['arch']} |"
        lines = [line for line in readme.splitlines() if line.startswith(prefix)]
        assert lines, f"kernels/README.md lacks the row {prefix}"
        cells = [cell.strip() for cell in lines[0].strip("|").split("|")]
        assert cells[4] == str(row["spill_bytes"]) and cells[5] == f"{row['smem']:,}", lines[0]


def test_parse_names_of_the_tensor_core_variants():
    names = [
        ptxas._describe("_ZN7attattr12_GLOBAL__N_111attr_kernelI13__nv_bfloat16Li64ELb1EEEvPKT_"),
        ptxas._describe("_ZN7attattr12_GLOBAL__N_111attr_kernelIfLi64ELb0EEEvPKT_"),
        ptxas._describe("_ZN7attattr12_GLOBAL__N_115attn_fwd_kernelI6__halfLi32ELb1ELb1EEEvPKT_"),
        ptxas._describe("_ZN7attattr12_GLOBAL__N_115attn_fwd_kernelI6__halfLi32ELb0ELb1EEEvPKT_"),
        ptxas._describe("_ZN7attattr12_GLOBAL__N_115attn_fwd_kernelIfLi32ELb1ELb0EEEvPKT_"),
        ptxas._describe("_ZN7attattr12_GLOBAL__N_111attr_kernelI13__nv_bfloat16Li96ELb1ELb1EfEEvPKT_"),
    ]
    assert names == [
        ("attr_kernel+mma", "bfloat16", 64),
        ("attr_kernel", "float32", 64),
        ("attn_fwd_kernel+O+mma", "float16", 32),
        ("attn_fwd_kernel+mma", "float16", 32),
        ("attn_fwd_kernel+O", "float32", 32),
        ("attr_kernel+mma+splitG", "bfloat16", 96),
    ]
    assert ptxas.dynamic_smem("attr_kernel+mma", 128) == ptxas.dynamic_smem("attr_kernel", 128) + 64 * 65 * 4


MMA = {
    "bfloat16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
    "float16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32",
}


@pytest.fixture(scope="module")
def ptx():
    """{arch: PTX text} of attattr_attn.cu from ``nvcc -ptx`` for sm_80 and sm_90a (one
    compile at a time)."""
    toolkit = kernel.find_toolkit()
    if toolkit is None:
        pytest.skip("nvcc not found (CUDA_HOME, CUDA_PATH, PATH, /usr/local/cuda): no PTX check")
    out = {}
    for arch in ("sm_80", "sm_90a"):
        cmd = [str(toolkit.nvcc), "-ptx", "-std=c++17", "-O3", f"-arch={arch}", str(CU), "-o", "-"]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        assert proc.returncode == 0, f"nvcc -ptx -arch={arch} failed:\n{proc.stderr}"
        out[arch] = proc.stdout
    return out


def _entries(ptx_text: str) -> dict[str, str]:
    """{mangled kernel name: its PTX body} of every .entry."""
    parts = re.split(r"^\.visible \.entry |^\.entry ", ptx_text, flags=re.M)
    return {part.split("(", 1)[0].strip(): part for part in parts[1:]}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_ptx_of_the_tensor_core_kernels_holds_mma(ptx, arch):
    entries = _entries(ptx[arch])
    assert entries, "no .entry in the PTX"
    checked = 0
    counts = {}
    for name, body in entries.items():
        kern, dtype, head_dim = ptxas._describe(name)
        if not kern.startswith(("attr_kernel", "attn_fwd_kernel")):
            continue
        count = body.count("mma.sync.aligned.m16n8k16")
        counts[kern, dtype, head_dim] = count
        if "+mma" in kern:
            assert MMA[dtype] in body, f"{kern} {dtype} D={head_dim} {arch}: no {MMA[dtype]}"
            # two products of D / 16 k-steps x 4 tiles (one for the forward); loops may be unrolled
            assert count >= 4, (kern, dtype, head_dim, arch, count)
            checked += 1
        else:
            assert count == 0, f"{kern} {dtype} D={head_dim} {arch}: the fp32 path has mma"
    assert checked == 2 * 4 * 3 + 4  # (attr, fwd, fwd+O) x 4 head dims x 2 half dtypes, splitG
    # the forward with O computes P V on tensor cores too: beyond the Q K^T of the
    # statistics-only forward, the P V loop's 4 key steps x D / 16 tiles x 2 parts (hi, lo) of P
    # (fully unrolled)
    for dtype in MMA:
        for head_dim in (32, 64, 96, 128):
            extra = counts["attn_fwd_kernel+O+mma", dtype, head_dim] - counts["attn_fwd_kernel+mma", dtype, head_dim]
            assert extra >= 4 * (head_dim // 16) * 2, (dtype, head_dim, counts)
