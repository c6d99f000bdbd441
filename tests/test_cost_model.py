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


def test_kernel_on_tensor_cores_and_key_sums():
    """The kernel's tile products run at the tensor-core peak for bf16 (its fp32 path at the
    CUDA cores'), and the per-key-sum epilogue writes 2 n floats a layer instead of n x n."""
    h, f, layers, heads, _ = cost_model.PRESETS["qwen2-0.5b"]
    n = 8192
    sums = cost_model.costs(h, f, layers, heads, n, 2, "right", keep_maps=False, elt=2)
    keys = cost_model.costs(h, f, layers, heads, n, 2, "right", keep_maps=False, elt=2, keep_sources=True)
    assert sums["kernel"].bytes - keys["kernel"].bytes == layers * (n * n * 4 - 2 * n * 4)
    assert keys["kernel"].tc_flops == layers * 4 * n * n * h
    h200 = next(g for g in cost_model.GPUS if g.name.startswith("H200"))
    tc = cost_model.gpu_times(keys, h200, True, n, heads, layers)["kernel"]
    fp32 = cost_model.gpu_times(keys, h200, False, n, heads, layers)["kernel"]
    assert tc < fp32
    assert cost_model.launch_seconds(5800) == 5800 * cost_model.LAUNCH_US * 1e-6


def test_roofline_rows():
    rows = cost_model.roofline(launches={128: 2374})
    assert len(rows) == 2 * len(cost_model.ROOFLINE)
    assert {r["gpu"] for r in rows} == {"H100-SXM5", "H200-SXM"}
    for r in rows:
        assert r["total_s"] == r["linear_s"] + r["attention_s"] + r["kernel_s"] > 0
        assert r["kernel_s"] <= r["kernel_fp32_s"]
    assert all(("launch_floor_s" in r) == (r["n"] == 128) for r in rows)
