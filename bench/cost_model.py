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
tensor cores, as PyTorch runs float32 matmuls by default), the kernel on the plain fp32
units (it uses no tensor cores), scaled by its wave efficiency (blocks of the attribution
grid over whole waves of 2 blocks per SM).  These are lower bounds: real runs reach some
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
    Gpu("L4", 58, 30.3, 121.0, 300.0),
    Gpu("RTX-4090", 128, 82.6, 165.2, 1008.0),
]


@dataclass(frozen=True)
class Part:
    flops: float
    bytes: float


def costs(h: int, f: int, layers: int, heads: int, n: int, m: int, rule: str, keep_maps: bool,
          elt: int) -> dict[str, Part]:
    """FLOPs and bytes per example of the linear layers, the attention and the kernel."""
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
    kernel_out = n * n * 4 * (1 + (heads if keep_maps else 0))
    kernel = Part(
        flops=layers * (4 * n * n * h + 6 * heads * n * n),
        bytes=layers * (4 * n * h * elt * tiles + kernel_out),
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
        peak = gpu.fp32_tflops * 1e12 * wave_efficiency if name == "kernel" else matmul_peak
        out[name] = max(part.flops / peak, part.bytes / bandwidth)
    out["blocks"] = grid["blocks"]
    return out


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
    ap.add_argument("--keep", default="maps", choices=["maps", "sum"], help="the kernel writes per-head maps or only the head sum")
    ap.add_argument("--measure", action="store_true", help="also score one example of this shape on this CPU")
    ap.add_argument("--threads", type=int, default=1, help="CPU threads for --measure")
    args = ap.parse_args()
    name, (h, f, layers, heads, _vocab) = load_config(args.config)
    print(f"{name}: h={h}, ffn={f}, {layers} layers x {heads} heads; n={args.n}, m={args.m}, rule {args.rule}, "
          f"all layers, kernel writes {args.keep}")
    by_dtype = {}
    for dtype, elt in (("bf16", 2), ("fp32", 4)):
        by_dtype[dtype] = costs(h, f, layers, heads, args.n, args.m, args.rule, args.keep == "maps", elt)
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
