"""bench/cost_model.py: FLOP counts against hand-worked cases, and its output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

import cost_model  # noqa: E402


def test_one_layer_one_step_by_hand():
    h, f, n, heads = 8, 32, 10, 2
    # rule right, m = 1: the only node is alpha = 1, reused from the clean pass, so no
    # integration step; the clean forward + backward and the F(0) forward remain.
    parts = cost_model.costs(h, f, 1, heads, n, 1, "right", keep_maps=False, elt=4)
    per_layer = 2 * n * (4 * h * h + 2 * h * f)
    assert parts["linear"].flops == per_layer * 3  # 2 forwards + 1 backward
    assert parts["attention"].flops == 4 * n * n * h * (2 + 2 * 1)
    assert parts["kernel"].flops == 4 * n * n * h + 6 * heads * n * n
    # rule left, m = 2: nodes 0 and 1/2, no reuse, no extra F(0) forward
    parts = cost_model.costs(h, f, 1, heads, n, 2, "left", keep_maps=False, elt=4)
    assert parts["linear"].flops == per_layer * (1 + 2 + 2)  # clean fwd, 2 steps fwd + bwd


def test_bert_base_shares():
    h, f, layers, heads, _ = cost_model.PRESETS["bert-base"]
    parts = cost_model.costs(h, f, layers, heads, 128, 20, "right", keep_maps=True, elt=2)
    total = sum(p.flops for p in parts.values())
    assert parts["linear"].flops / total > 0.9
    assert parts["kernel"].flops / total < 1e-3
    h100 = next(g for g in cost_model.GPUS if g.name.startswith("H100"))
    bf16 = cost_model.gpu_times(parts, h100, True, 128, heads, layers)
    fp32 = cost_model.gpu_times(parts, h100, False, 128, heads, layers)
    assert bf16["blocks"] == 48
    assert fp32["linear"] > 5 * bf16["linear"]  # tensor cores carry the linear layers


def test_cli_prints_every_gpu():
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "cost_model.py"), "--config", "minilm", "--n", "64"],
                          capture_output=True, text=True, timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": ""})
    assert proc.returncode == 0, proc.stderr
    for gpu in cost_model.GPUS:
        assert proc.stdout.count(gpu.name) == 2  # bf16 and fp32 rows
    assert "GFLOP" in proc.stdout
