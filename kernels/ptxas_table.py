"""Print the ptxas resource table of kernels/README.md (needs nvcc, no GPU).

    python kernels/ptxas_table.py            # sm_80 and sm_90
    python kernels/ptxas_table.py --strict   # exit 1 on a spill or < 2 blocks per SM by registers
"""

from __future__ import annotations

import sys
from pathlib import Path

from attattr_cli.ops import kernel, ptxas

CU = Path(__file__).resolve().parents[1] / "attattr_cli" / "kernels" / "attattr_attn.cu"


def main() -> int:
    strict = "--strict" in sys.argv[1:]
    toolkit = kernel.find_toolkit()
    if toolkit is None:
        print("nvcc not found: set CUDA_HOME", file=sys.stderr)
        return 1
    code, log = ptxas.compile_report(CU, str(toolkit.nvcc))
    if code != 0:
        print(log, file=sys.stderr)
        return 1
    print(f"<!-- ptxas of {toolkit.root} -->")
    print("| kernel | D | arch | registers | spill bytes | shared memory / block (bytes) | blocks / SM (registers) | blocks / SM (shared memory) |")
    print("|---|---|---|---|---|---|---|---|")
    rows = ptxas.summary_rows(ptxas.parse(log))
    for row in rows:
        print(
            f"| {row['kernel']} | {row['head_dim'] or '-'} | {row['arch']} | {row['registers']} | "
            f"{row['spill_bytes']} | {row['smem']:,} | {row['blocks_by_regs']} | {row['blocks_by_smem'] if row['smem'] else '-'} |"
        )
    bad = [row for row in rows if row["spill_bytes"] or row["stack"] or row["blocks_by_regs"] < 2]
    for row in bad:
        print(f"{row['kernel']} D={row['head_dim']} {row['arch']}: {row['spill_bytes']} bytes spilled, "
              f"{row['registers']} registers", file=sys.stderr)
    return 1 if strict and bad else 0


if __name__ == "__main__":
    sys.exit(main())
