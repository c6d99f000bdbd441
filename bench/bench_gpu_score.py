"""GPU benchmark of `score` on BERT-base (random init from a config), from one run.

For n = 128 and 512 tokens, m = 20, all 12 layers, bf16 by default: seconds per example for
  attattr --kernel cuda    the fused kernel for the target layer
  attattr --kernel cuda, CUDA graphs
                           the same with ATTATTR_CUDA_GRAPHS=1: the first example of the length
                           captures its passes (the warm-up), the timed ones (other words, the
                           same length) replay them
  attattr --kernel cuda, groups of 32
                           what `attattr score` does by default for an encoder classifier: 32
                           examples (other words, the same length) per pass, time / 32
  attattr --kernel torch   the pure-PyTorch reference path
  2021 procedure           every layer at batch m with full probabilities (tests/slow_reference.py)
and the ratios, beside bench/cost_model.py's time at peak when the GPU is one it knows, and
where one example's time goes (the clean forward and backward, the integration passes, the
maps and sums, the results' way to the host; the device synchronised around each);
then the peak GPU memory of one target layer's attribution (kernel vs reference) at
n = 2048 and 4096.

Run on a GPU machine: `just gpu-bench` (also runs bench/bench_kernel.py). With
`--device cpu --ns 32 --mem-ns 64` it runs a small smoke version anywhere.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slow_reference import slow_attribution  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
import cost_model  # noqa: E402

from attattr_cli.data.types import Example  # noqa: E402
from attattr_cli.engine.integrate import nodes  # noqa: E402
from attattr_cli.engine.scorer import Scorer  # noqa: E402
from attattr_cli.engine.options import ScoreOptions  # noqa: E402
from attattr_cli.models.loading import prepare  # noqa: E402
from attattr_cli.ops import select_backend  # noqa: E402


def bert_base(device, dtype, layers=12):
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizerFast

    torch.manual_seed(0)
    cfg = BertConfig(num_hidden_layers=layers, num_labels=3, max_position_embeddings=8192)
    model = BertForSequenceClassification(cfg).to(device=device, dtype=dtype).eval()
    vocab = ROOT / "bench" / ".vocab.txt"
    if not vocab.exists():
        vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(1000)]))
    tok = BertTokenizerFast(str(vocab), model_max_length=8192)
    return prepare(model, tok, "bert-base (random init)")


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, device, repeat=3):
    fn()  # warm-up (and kernel build)
    sync(device)
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    sync(device)
    return (time.perf_counter() - t0) / repeat


def known_gpu(device):
    """The cost model's entry for this device, or None."""
    if device.type != "cuda":
        return None
    tokens = set(torch.cuda.get_device_name(device).lower().replace("-", " ").split())
    for gpu in cost_model.GPUS:  # "NVIDIA A100-SXM4-80GB" -> A100, "NVIDIA GeForce RTX 4090" -> RTX-4090
        key = gpu.name.lower().removeprefix("rtx-").split("-")[0]
        if key in tokens:
            return gpu
    return None


def graphed(loaded, args, kind: str, n: int, device) -> float:
    """Seconds per example with ATTATTR_CUDA_GRAPHS=1: the warm-up example captures the passes of
    its length, the timed ones (other words, the same length) replay them (on the CPU:
    ATTATTR_CUDA_GRAPHS=emulate, which checks the path, not the time)."""
    examples = [Example(i, " ".join(f"w{(i * 37 + j) % 1000}" for j in range(n - 2))) for i in range(4)]
    before = os.environ.get("ATTATTR_CUDA_GRAPHS")
    os.environ["ATTATTR_CUDA_GRAPHS"] = "1" if device.type == "cuda" else "emulate"
    try:
        scorer = Scorer(loaded, ScoreOptions(steps=args.steps, dtype=args.dtype, kernel=kind))
        turn = iter(range(10**6))
        secs = timed(lambda: scorer.score(examples[next(turn) % len(examples)]), device)
        shared = scorer.__dict__.get("_graphs")
        print(f"  (graphs at n = {n}: {shared.stats() if shared is not None else 'none made'})")
        return secs
    finally:
        if before is None:
            os.environ.pop("ATTATTR_CUDA_GRAPHS", None)
        else:
            os.environ["ATTATTR_CUDA_GRAPHS"] = before


PHASES = {  # (owner, attribute) of the calls each phase times (the outermost call where they nest)
    "clean forward and backward": [("Scorer", "clean_forward"), ("Scorer", "at_one"), ("Scorer", "graphed_clean")],
    "integration passes": [("sweep", "integrate"), ("Scorer", "integrate")],
    "maps and sums": [("Scorer", "layer_results"), ("Scorer", "layer_result")],
    "results to the host": [("Scorer", "family_score"), ("Scorer", "example_score")],
}


def phases(loaded, args, kind: str, n: int, device) -> dict:
    """Milliseconds per example in each of :data:`PHASES` and the rest, one example scored eagerly
    with the device synchronised around every timed call (so the parts add up to a little more
    than the plain time): where an example's time goes."""
    from attattr_cli.engine import sweep

    scorer = Scorer(loaded, ScoreOptions(steps=args.steps, dtype=args.dtype, kernel=kind))
    example = Example(0, " ".join(f"w{(j * 7) % 1000}" for j in range(n - 2)))
    spent = dict.fromkeys(PHASES, 0.0)  # (the warm-up below runs before the calls are wrapped)
    depth = [0]
    restore = []

    def wrap(phase, fn):
        def timed_call(*a, **k):
            if depth[0]:
                return fn(*a, **k)
            sync(device)
            t0 = time.perf_counter()
            depth[0] += 1
            try:
                return fn(*a, **k)
            finally:
                depth[0] -= 1
                sync(device)
                spent[phase] += time.perf_counter() - t0
        return timed_call

    owners = {"Scorer": Scorer, "sweep": sweep}
    scorer.score(example)  # warm-up
    for phase, calls in PHASES.items():
        for owner_name, name in calls:
            owner = owners[owner_name]
            original = getattr(owner, name)
            restore.append((owner, name, owner.__dict__.get(name)))
            setattr(owner, name, wrap(phase, original))
    try:
        sync(device)
        t0 = time.perf_counter()
        scorer.score(example)
        sync(device)
        total = time.perf_counter() - t0
    finally:
        for owner, name, before in reversed(restore):
            if before is None:
                delattr(owner, name)
            else:
                setattr(owner, name, before)
    out = {phase: 1e3 * secs for phase, secs in spent.items()}
    out["rest"] = 1e3 * total - sum(out.values())
    out["total"] = 1e3 * total
    print(f"  (phases at n = {n}, {kind}, ms: " + ", ".join(f"{k} {v:.1f}" for k, v in out.items()) + ")")
    return out


def in_groups(loaded, args, kind: str, n: int, device) -> float:
    """Seconds per example when ``args.group`` examples of length ``n`` share each pass (the
    default of `attattr score` for encoder classifiers, engine/grouped.py)."""
    from attattr_cli.engine import grouped

    scorer = Scorer(loaded, ScoreOptions(steps=args.steps, dtype=args.dtype, kernel=kind, group=args.group))
    examples = [Example(i, " ".join(f"w{(i * 37 + j) % 1000}" for j in range(n - 2))) for i in range(args.group)]
    encs = [scorer.encode(e) for e in examples]
    return timed(lambda: grouped.score_group(scorer, examples, encs), device, repeat=1) / len(examples)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--ns", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--mem-ns", type=int, nargs="+", default=[2048, 4096])
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--group", type=int, default=32, help="examples per pass for the grouped row")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_gpu_score: no CUDA device here; run it on a GPU machine (just gpu-bench)")
    dtype = getattr(torch, args.dtype)
    loaded = bert_base(device, dtype, args.layers)
    model = loaded.model
    alphas, weights = nodes("right", args.steps)
    kinds = ["cuda", "torch"] if device.type == "cuda" else ["torch"]
    print(f"BERT-base ({args.layers} layers x 12 heads, random init), m = {args.steps}, all layers, {args.dtype}, "
          f"{torch.cuda.get_device_name() if device.type == 'cuda' else 'cpu'}, torch {torch.__version__}")
    for n in args.ns:
        words = " ".join(f"w{i % 1000}" for i in range(n - 2))
        example = Example(0, words)
        rows = {}
        for kind in kinds:
            scorer = Scorer(loaded, ScoreOptions(steps=args.steps, dtype=args.dtype, kernel=kind))
            rows[f"attattr --kernel {kind}"] = timed(lambda s=scorer: s.score(example), device)
            if kind == kinds[0]:  # (on the CPU the graphs are emulated: a check of the code, not a time)
                label = "CUDA graphs" if device.type == "cuda" else "graphs emulated"
                rows[f"attattr --kernel {kind}, {label}"] = graphed(loaded, args, kind, n, device)
                rows[f"attattr --kernel {kind}, groups of {args.group}"] = in_groups(loaded, args, kind, n, device)
                phases(loaded, args, kind, n, device)
        enc = Scorer(loaded, ScoreOptions(steps=args.steps, dtype=args.dtype, kernel="torch")).encode(example)
        inputs = {"input_ids": torch.tensor([enc.input_ids], device=device),
                  "token_type_ids": torch.tensor([enc.token_type_ids], device=device)}
        try:
            rows["2021 procedure"] = timed(
                lambda: slow_attribution(model, inputs, range(args.layers), alphas, weights, 0, with_baseline=False), device, repeat=1)
        except torch.OutOfMemoryError:
            rows["2021 procedure"] = float("nan")
        base = rows[f"attattr --kernel {kinds[0]}"]
        print(f"n = {n}")
        gpu = known_gpu(device)
        if gpu is not None:
            h, f, _, heads, _ = cost_model.PRESETS["bert-base"]
            elt = 2 if dtype in (torch.bfloat16, torch.float16) else 4
            parts = cost_model.costs(h, f, args.layers, heads, n, args.steps, "right", True, elt)
            t = cost_model.gpu_times(parts, gpu, elt == 2, n, heads, args.layers)
            print(f"  {'cost model at peak':<40} {t['linear'] + t['attention'] + t['kernel']:9.4f} s/example"
                  f"   ({gpu.name}: linear {1e3 * t['linear']:.2f} ms, attention {1e3 * t['attention']:.2f} ms,"
                  f" kernel {1e3 * t['kernel']:.3f} ms)")
        for name, secs in rows.items():
            print(f"  {name:<40} {secs:9.4f} s/example   {secs / base:6.2f}x of attattr --kernel {kinds[0]}")
    # memory of one target layer's attribution op
    print("peak memory of one target layer's attribution (12 heads, d = 64):")
    for n in args.mem_ns:
        q, k, v, g = (torch.randn(1, 12, n, 64, device=device, dtype=dtype) for _ in range(4))
        for kind in kinds:
            backend = select_backend(kind, device)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
                start = torch.cuda.memory_allocated()
            backend.attribution_from_grad(q, k, v, g, scale=0.125, want_maps=False)
            sync(device)
            peak = (torch.cuda.max_memory_allocated() - start) / 2**20 if device.type == "cuda" else float("nan")
            print(f"  n = {n:<6} {kind:<6} {peak:10.1f} MiB")
        del q, k, v, g


if __name__ == "__main__":
    main()
