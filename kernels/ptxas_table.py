"""Print the ptxas resource table of kernels/README.md (needs nvcc, no GPU).

    python kernels/ptxas_table.py            # sm_80 and sm_90
"""

from __future__ import annotations

import sys
from pathlib import Path

from attattr_cli.ops import kernel, ptxas

CU = Path(__file__).resolve().parents[1] / "attattr_cli" / "kernels" / "attattr_attn.cu"


def main() -> int:
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
    for row in ptxas.summary_rows(ptxas.parse(log)):
        print(
            f"| {row['kernel']} | {row['head_dim'] or '-'} | {row['arch']} | {row['registers']} | "
            f"{row['spill_bytes']} | {row['smem']:,} | {row['blocks_by_regs']} | {row['blocks_by_smem'] if row['smem'] else '-'} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
