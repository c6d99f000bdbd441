"""Analytic cost of scoring one example: where the time goes, before renting a GPU.

    python bench/cost_model.py                                   # BERT-base, n = 128, m = 20
    python bench/cost_model.py --config minilm --n 64 --measure  # + a measured CPU run
    python bench/cost_model.py --config path/to/config.json --n 512 --rule gauss

For a config (hidden size h, FFN size f, L layers, H heads), n tokens, m steps and a
quadrature rule, scoring every layer costs per example:

* the clean pass: one forward of the L layers and, when the rule has the node alpha = 1,
  one backward (the gradient there is reused for every target layer);
* per target layer l (counted from the bottom, 0-based): s = m steps (minus the reused
  alpha = 1 node) of a forward and a backward through the L - l layers from l up (the
  layers below are replayed from the clean pass), and a forward for F(alpha = 0) when
  the rule has no node at 0;
* per target layer the attribution ``A * (G V^T)``: the fused kernel.

FLOPs (multiply-add = 2): linear layers ``2 n (4 h^2 + 2 h f)`` per layer forward and the
same backward (activation gradients only: no weight gradients are taken); attention
``4 n^2 h`` forward, twice that backward; the kernel ``4 n^2 h`` (Q K^T and G V^T per
head) plus ``6 H n^2`` for the exponentials and products.  Bytes: linear layers read
their weights once per pass plus ``(8 h + 2 f) n`` activations per layer and step;
attention (fused, flash style) reads and writes ``4 n h`` per layer and step; the kernel
reads Q, K, V, G once per 64-row tile pair (``4 n h (n / 64)`` elements) and writes the
head sum (and the maps with ``--keep maps``) in float32.

Each part's time on a GPU is ``max(FLOPs / peak, bytes / bandwidth)`` at the data sheet's
dense peak: linear layers and attention on tensor cores in bfloat16 (fp32 without
tensor cores, as PyTorch runs float32 matmuls by default), the kernel's tile products on
the tensor cores for bf16 and on the plain fp32 units for fp32 (its two paths), its
exponentials and products on the fp32 units, scaled by its wave efficiency (blocks of the
attribution grid over whole waves of 2 blocks per SM). ``launch_seconds`` is the floor that
issuing kernels one by one puts under a time (``LAUNCH_US`` each). ``--roofline`` prints the
table of docs/benchmarks.md (issue 53's scenarios on H100 and H200).  These are lower bounds: real runs reach some
fraction of peak.  ``--measure`` scores one example of that shape on this CPU (random
weights) and prints the seconds and the FLOP rate it implies beside the predictions.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.engine.integrate import RULES, nodes  # noqa: E402
from attattr_cli.ops.kernel import attribution_grid  # noqa: E402

PRESETS = {  # hidden, ffn, layers, heads, vocab
    "bert-base": (768, 3072, 12, 12, 30522),
    "bert-large": (1024, 4096, 24, 16, 30522),
    "minilm": (384, 1536, 6, 12, 30522),
    "qwen2-0.5b": (896, 4864, 24, 14, 151936),
    "smollm2-135m": (576, 1536, 30, 9, 49152),
}


@dataclass(frozen=True)
class Gpu:
    name: str
    sms: int
    fp32_tflops: float  # plain FP32 (CUDA cores)
    bf16_tflops: float  # dense bf16 tensor cores, fp32 accumulation
    bandwidth_gbs: float


# Dense (no sparsity) peaks from the vendors' data sheets.
GPUS = [
    Gpu("A100-SXM4-80GB", 108, 19.5, 312.0, 2039.0),
    Gpu("H100-SXM5", 132, 67.0, 989.0, 3350.0),
    Gpu("H200-SXM", 132, 67.0, 989.0, 4800.0),
    Gpu("L4", 58, 30.3, 121.0, 300.0),
    Gpu("RTX-4090", 128, 82.6, 165.2, 1008.0),
]


@dataclass(frozen=True)
class Part:
    flops: float
    bytes: float
    tc_flops: float = 0.0  # of ``flops``, the kernel's tile products (tensor cores for half inputs)


# CPU time to issue one CUDA kernel launch (eager PyTorch: the dispatcher, the launch itself);
# a few microseconds on current machines. A replayed CUDA graph issues its kernels from the GPU.
LAUNCH_US = 4.0


def launch_seconds(launches: int, per_launch_us: float = LAUNCH_US) -> float:
    """The floor that issuing ``launches`` kernels one by one puts under an example's time."""
    return launches * per_launch_us * 1e-6


def costs(h: int, f: int, layers: int, heads: int, n: int, m: int, rule: str, keep_maps: bool,
          elt: int, keep_sources: bool = False) -> dict[str, Part]:
    """FLOPs and bytes per example of the linear layers, the attention and the kernel.

    ``keep_sources``: the kernel writes per-key sums (its epilogue, 2 n floats per layer)
    instead of the n x n head sum."""
    alphas, _ = nodes(rule, m)
    has_one = bool((alphas == 1).any())
    has_zero = bool((alphas == 0).any())
    steps = len(alphas) - (1 if has_one else 0)
    lin_fwd = 2 * n * (4 * h * h + 2 * h * f)
    lin_bytes = (4 * h * h + 2 * h * f) * elt  # weights, once per pass
    lin_act = (8 * h + 2 * f) * n * elt
    att_fwd = 4 * n * n * h
    att_bytes = 4 * n * h * elt
    # layer-passes: the clean forward (+ backward), then per target l the layers above
    above = sum(layers - l for l in range(layers))  # sum over targets of (L - l)
    fwd_layers = layers + steps * above + (0 if has_zero else above)
    bwd_layers = (layers if has_one else 0) + steps * above
    passes = 1 + (1 if has_one else 0) + layers * (1 + (0 if has_zero else 1))  # weight reads
    linear = Part(
        flops=lin_fwd * (fwd_layers + bwd_layers),
        bytes=lin_bytes * passes * layers + lin_act * (fwd_layers + 2 * bwd_layers),
    )
    attention = Part(
        flops=att_fwd * (fwd_layers + 2 * bwd_layers),
        bytes=att_bytes * (fwd_layers + 2 * bwd_layers),
    )
    tiles = -(-n // 64)
    kernel_out = 2 * n * 4 if keep_sources else n * n * 4 * (1 + (heads if keep_maps else 0))
    kernel = Part(
        flops=layers * (4 * n * n * h + 6 * heads * n * n),
        bytes=layers * (4 * n * h * elt * tiles + kernel_out),
        tc_flops=layers * 4 * n * n * h,
    )
    return {"linear": linear, "attention": attention, "kernel": kernel}


def gpu_times(parts: dict[str, Part], gpu: Gpu, bf16: bool, n: int, heads: int, layers: int) -> dict[str, float]:
    """Seconds per part at peak on ``gpu``."""
    matmul_peak = (gpu.bf16_tflops if bf16 else gpu.fp32_tflops) * 1e12
    bandwidth = gpu.bandwidth_gbs * 1e9
    grid = attribution_grid(1, heads, n, n, gpu.sms)
    resident = 2 * gpu.sms
    waves = -(-grid["blocks"] // resident)
    wave_efficiency = grid["blocks"] / (waves * resident)
    out = {}
    for name, part in parts.items():
        if name == "kernel":  # products on tensor cores (bf16) or FMAs (fp32), the rest on the CUDA cores
            compute = (part.tc_flops / matmul_peak + (part.flops - part.tc_flops) / (gpu.fp32_tflops * 1e12))
            out[name] = max(compute / wave_efficiency, part.bytes / bandwidth)
        else:
            out[name] = max(part.flops / matmul_peak, part.bytes / bandwidth)
    out["blocks"] = grid["blocks"]
    return out


# The issue-53 scenarios of docs/benchmarks.md's roofline table: (label, preset, n, m, rule, keep)
ROOFLINE = [
    ("BERT-base, 128 tokens, m = 20, maps", "bert-base", 128, 20, "right", "maps"),
    ("BERT-base, 512 tokens, m = 20, maps", "bert-base", 512, 20, "right", "maps"),
    ("Qwen2-0.5B, 8,192 tokens, sources (2 nodes)", "qwen2-0.5b", 8192, 2, "right", "sources"),
    ("Qwen2-0.5B, 32,768 tokens, sources (2 nodes)", "qwen2-0.5b", 32768, 2, "right", "sources"),
]


def roofline(gpu_names=("H100-SXM5", "H200-SXM"), launches: dict | None = None) -> list[dict]:
    """Time at peak per part for the ROOFLINE scenarios, bf16 layers, the kernel on tensor
    cores and (``kernel_fp32``) on its fp32 CUDA-core path; ``launches`` {n: count} adds the
    launch floor (``launch_seconds``) where known."""
    rows = []
    for label, preset, n, m, rule, keep in ROOFLINE:
        h, f, layers, heads, _ = PRESETS[preset]
        parts = costs(h, f, layers, heads, n, m, rule, keep == "maps", 2, keep_sources=keep == "sources")
        for gpu in GPUS:
            if gpu.name not in gpu_names:
                continue
            t = gpu_times(parts, gpu, True, n, heads, layers)
            t32 = gpu_times(parts, gpu, False, n, heads, layers)
            row = {"scenario": label, "gpu": gpu.name, "n": n, "linear_s": t["linear"],
                   "attention_s": t["attention"], "kernel_s": t["kernel"], "kernel_fp32_s": t32["kernel"],
                   "total_s": t["linear"] + t["attention"] + t["kernel"],
                   "kernel_tflop": parts["kernel"].flops / 1e12, "all_tflop": sum(p.flops for p in parts.values()) / 1e12}
            if launches and n in launches:
                row["launch_floor_s"] = launch_seconds(launches[n])
            rows.append(row)
    return rows


def load_config(spec: str) -> tuple[str, tuple[int, int, int, int, int]]:
    if spec in PRESETS:
        return spec, PRESETS[spec]
    path = Path(spec)
    if path.is_dir():
        path = path / "config.json"
    if not path.is_file():
        sys.exit(f"--config: not a preset ({', '.join(PRESETS)}) nor a config.json: {spec}")
    cfg = json.loads(path.read_text())
    h = int(cfg.get("hidden_size") or cfg.get("d_model") or cfg["n_embd"])
    f = int(cfg.get("intermediate_size") or cfg.get("n_inner") or 4 * h)
    layers = int(cfg.get("num_hidden_layers") or cfg.get("n_layer"))
    heads = int(cfg.get("num_attention_heads") or cfg.get("n_head"))
    return path.parent.name, (h, f, layers, heads, int(cfg.get("vocab_size", 30522)))


def measure_cpu(h: int, f: int, layers: int, heads: int, n: int, m: int, rule: str, threads: int) -> float:
    """Seconds to score one n-token example with a random BERT of this shape on the CPU."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    from attattr_cli.data.types import Example
    from attattr_cli.models.loading import prepare

    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    cfg = BertConfig(hidden_size=h, intermediate_size=f, num_hidden_layers=layers, num_attention_heads=heads,
                     num_labels=2, max_position_embeddings=max(512, n + 2))
    model = BertForSequenceClassification(cfg).eval()
    vocab = ROOT / "bench" / ".vocab.txt"
    if not vocab.exists():
        vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1000)]))
    tok = BertTokenizerFast(str(vocab), model_max_length=8192)
    scorer = Scorer(prepare(model, tok, "random BERT"), ScoreOptions(steps=m, rule=rule, kernel="torch"))
    example = Example(index=0, text_a=" ".join(f"w{i % 1000}" for i in range(n - 2)), text_b=None, label=0)
    tokens = len(scorer.encode(example).input_ids)
    if tokens != n:
        sys.exit(f"internal: the measured example has {tokens} tokens, not {n}")
    scorer.score(example)  # warm-up
    start = time.perf_counter()
    scorer.score(example)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="bert-base", help=f"a preset ({', '.join(PRESETS)}) or a config.json / model folder")
    ap.add_argument("--n", type=int, default=128, help="tokens per example")
    ap.add_argument("--m", type=int, default=20, help="integration steps")
    ap.add_argument("--rule", default="right", choices=sorted(RULES))
    ap.add_argument("--keep", default="maps", choices=["maps", "sum", "sources"],
                    help="the kernel writes per-head maps, only the head sum, or per-key sums")
    ap.add_argument("--roofline", action="store_true", help="print docs/benchmarks.md's roofline table and exit")
    ap.add_argument("--measure", action="store_true", help="also score one example of this shape on this CPU")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for --measure")
    args = ap.parse_args()
    if args.roofline:
        print("| scenario | GPU | linear | attention | kernel (tensor cores) | kernel (fp32 path) | total at peak |")
        print("|---|---|---|---|---|---|---|")
        for r in roofline():
            print(f"| {r['scenario']} | {r['gpu']} | {1e3 * r['linear_s']:,.2f} ms | {1e3 * r['attention_s']:,.3f} ms | "
                  f"{1e3 * r['kernel_s']:,.4f} ms | {1e3 * r['kernel_fp32_s']:,.4f} ms | {1e3 * r['total_s']:,.2f} ms |")
        return
    name, (h, f, layers, heads, _vocab) = load_config(args.config)
    print(f"{name}: h={h}, ffn={f}, {layers} layers x {heads} heads; n={args.n}, m={args.m}, rule {args.rule}, "
          f"all layers, kernel writes {args.keep}")
    by_dtype = {}
    for dtype, elt in (("bf16", 2), ("fp32", 4)):
        by_dtype[dtype] = costs(h, f, layers, heads, args.n, args.m, args.rule, args.keep == "maps", elt,
                                keep_sources=args.keep == "sources")
    parts = by_dtype["fp32"]
    total = sum(p.flops for p in parts.values())
    print("per example: " + ", ".join(
        f"{k} {p.flops / 1e9:,.1f} GFLOP ({100 * p.flops / total:.2f} %)" for k, p in parts.items()))
    header = f"{'GPU':<16} {'dtype':<5} {'linear ms':>10} {'attention ms':>13} {'kernel ms':>10} {'total ms':>9} {'kernel blocks':>14}"
    print(header)
    for gpu in GPUS:
        for dtype in ("bf16", "fp32"):
            t = gpu_times(by_dtype[dtype], gpu, dtype == "bf16", args.n, heads, layers)
            tot = t["linear"] + t["attention"] + t["kernel"]
            print(f"{gpu.name:<16} {dtype:<5} {1e3 * t['linear']:>10.2f} {1e3 * t['attention']:>13.3f} "
                  f"{1e3 * t['kernel']:>10.4f} {1e3 * tot:>9.2f} {t['blocks']:>14}")
    print("(at the data sheets' dense peaks: lower bounds; bf16 = layers on bf16 tensor cores, fp32 = no tensor cores)")
    if args.measure:
        seconds = measure_cpu(h, f, layers, heads, args.n, args.m, args.rule, args.threads)
        print(f"measured on this CPU ({args.threads} thread{'s' if args.threads > 1 else ''}, fp32, torch backend): "
              f"{seconds:.2f} s per example = {total / seconds / 1e9:.1f} GFLOP/s by this model's count")


if __name__ == "__main__":
    main()
