"""Long-context sources on a GPU (issue 53): ``--keep sources`` at 8,192 and 32,768 tokens.

A decoder LM randomly initialised from a config (no download): Qwen2-0.5B's (24 layers,
hidden 896, 14 heads / 2 kv heads) or SmolLM2-135M's (30 layers, hidden 576, 9 heads /
3 kv heads), one random prompt of n tokens, target the predicted next token at the last
position, every layer, ``--keep sources`` (per key, the attribution summed over heads and
query rows: the store keeps [layer, key], no n x n map), the integration ``score --sources``
uses by default (the right rule with 2 nodes; ``--steps`` to change it). Printed and written
(``--json``): seconds per example, the peak GPU memory (``torch.cuda.max_memory_allocated``
above the loaded model) and the micro-batch of steps, per length; an out-of-memory error or
the time limit is reported, not raised.

Also (``--op``, default on) the target-layer op alone at each length: one layer's
attribution of bfloat16 q, k, v with a float32 G reduced to the per-key sums, by the
kernel's per-key-sum epilogue (``attribution_key_sums``: no n x n array) and by the head
sum (``attribution_from_grad(want_maps=False)``, an n x n float32 array), time and peak
memory of each.

    python bench/bench_long_sources.py --n 8192 32768 --json out.json      # a GPU machine
    python bench/bench_long_sources.py --smoke                             # CPU, tiny, anywhere

Each length runs in its own process (``--child``), so a failure or the limit of one
leaves the others their turn and each peak is its own.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CONFIGS = {
    "qwen2-0.5b": ("Qwen2Config", dict(
        vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
        num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
        rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=None,
        use_sliding_window=False)),
    "smollm2-135m": ("LlamaConfig", dict(
        vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
        num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=32768,
        rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True)),
    "tiny": ("Qwen2Config", dict(
        vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
        rope_theta=10000.0, tie_word_embeddings=True)),
}


class _Tokens:
    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


def child(args) -> dict:
    import torch
    import transformers as tf

    from attattr_cli.data.types import Example
    from attattr_cli.engine.encoding import Encoded
    from attattr_cli.engine.options import ScoreOptions, integration
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.models.loading import prepare

    gpu = torch.cuda.is_available() and not args.smoke
    device = torch.device("cuda" if gpu else "cpu")
    n = args.n[0]
    kind, cfg_kwargs = CONFIGS[args.config]
    cfg = getattr(tf, kind)(**cfg_kwargs)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if gpu else torch.float32
    model = getattr(tf, kind.replace("Config", "ForCausalLM"))(cfg).to(device=device, dtype=dtype)
    loaded = prepare(model, _Tokens(), f"{args.config}-random", lm=True)
    ids = torch.randint(10, cfg.vocab_size, (n,), generator=torch.Generator().manual_seed(1)).tolist()
    how = integration(args.steps, None, None, sources="default")
    out = {"n": n, "config": args.config, "device": torch.cuda.get_device_name() if gpu else "cpu",
           "dtype": str(dtype).split(".")[-1], "integration": how, "status": "ok"}
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    try:
        options = ScoreOptions(**how, dtype=out["dtype"], lm=True, keep="sources", step_batch=args.step_batch,
                               kernel=args.kernel)
        scorer = Scorer(loaded, options)
        enc = Encoded(ids, [f"t{t}" for t in ids], [0] * n, None, lm_positions=[n - 1])
        t0 = time.perf_counter()
        result = scorer.score(Example(0, ""), enc)
        if gpu:
            torch.cuda.synchronize()
        out["seconds"] = time.perf_counter() - t0
        fam = result.families["self"]
        out["key_sum_shape"] = list(fam.key_sum.shape) if fam.key_sum is not None else None
        out["step_batch"] = getattr(result, "step_batch", None)
    except torch.OutOfMemoryError as error:
        out["status"] = f"out of memory ({str(error).splitlines()[0][:160]})"
    if gpu:
        out["peak_gib"] = (torch.cuda.max_memory_allocated() - base) / 2**30
    if args.op and out["status"] == "ok":
        out["op"] = op_only(n, cfg, device)
    return out


def op_only(n: int, cfg, device) -> dict:
    """The target-layer op alone: per-key sums by the epilogue vs by the head sum."""
    import torch

    from attattr_cli.ops import select_backend

    backend = select_backend("auto", device)
    heads, d = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads
    gen = torch.Generator(device=device).manual_seed(2)
    q, k, v = (torch.randn(1, heads, n, d, device=device, generator=gen).to(
        torch.bfloat16 if device.type == "cuda" else torch.float32) for _ in range(3))
    g = torch.randn(1, heads, n, d, device=device, generator=gen) * 1e-3
    row = {"backend": backend.name, "heads": heads, "d_head": d}
    for name, call in (
        ("key_sums", lambda: backend.attribution_key_sums(q, k, v, g, causal=True, read_from=n // 2)),
        ("head_sum", lambda: backend.attribution_from_grad(q, k, v, g, causal=True, want_maps=False)),
    ):
        try:
            call()
            if device.type == "cuda":
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
            t0 = time.perf_counter()
            res = call()
            if device.type == "cuda":
                torch.cuda.synchronize()
            row[f"{name}_ms"] = (time.perf_counter() - t0) * 1e3
            if device.type == "cuda":
                row[f"{name}_peak_mib"] = (torch.cuda.max_memory_allocated() - base) / 2**20
            if name == "key_sums":
                keys = res["key_sum"]
            else:
                row["max_abs_diff_vs_head_sum"] = float((res["head_sum"].sum(1) - keys).abs().max())
            del res
        except torch.OutOfMemoryError as error:
            row[f"{name}_status"] = f"out of memory ({str(error).splitlines()[0][:120]})"
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="+", default=None, help="lengths (default 8192 32768; --smoke: 96)")
    ap.add_argument("--config", choices=sorted(CONFIGS), default=None, help="default qwen2-0.5b (--smoke: tiny)")
    ap.add_argument("--steps", type=int, default=None, help="a fixed right rule of this many nodes (default: score --sources')")
    ap.add_argument("--step-batch", type=int, default=None, help="steps per pass (default: what fits the free memory)")
    ap.add_argument("--kernel", default="auto")
    ap.add_argument("--no-op", dest="op", action="store_false", help="leave out the op-only measure")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per length")
    ap.add_argument("--smoke", action="store_true", help="CPU, the tiny config at 96 tokens")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.config = args.config or ("tiny" if args.smoke else "qwen2-0.5b")
    args.n = args.n or ([96] if args.smoke else [8192, 32768])
    if args.child:
        print(json.dumps(child(args)))
        return 0
    rows = []
    for n in args.n:
        cmd = [sys.executable, __file__, "--child", "--n", str(n), "--config", args.config, "--kernel", args.kernel] \
            + (["--steps", str(args.steps)] if args.steps else []) \
            + (["--step-batch", str(args.step_batch)] if args.step_batch else []) \
            + ([] if args.op else ["--no-op"]) + (["--smoke"] if args.smoke else [])
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
            lines = proc.stdout.strip().splitlines()
            if proc.returncode == 0 and lines:
                row = json.loads(lines[-1])
            else:
                row = {"n": n, "status": "failed: " + ((proc.stderr.strip().splitlines() or ["?"])[-1])[:300]}
        except subprocess.TimeoutExpired:
            row = {"n": n, "status": f"not finished within {args.timeout:.0f} s"}
        row["wall_seconds"] = time.perf_counter() - t0
        rows.append(row)
        op = row.get("op", {})
        print(f"# sources n = {n} ({row.get('config', args.config)}, {row.get('device', '?')}): {row['status']}, "
              f"{row.get('seconds', float('nan')):.1f} s, peak {row.get('peak_gib', float('nan')):.2f} GiB above the "
              f"model; op alone ({op.get('backend', '-')}): key sums {op.get('key_sums_ms', float('nan')):.1f} ms "
              f"{op.get('key_sums_peak_mib', float('nan')):.0f} MiB, head sum {op.get('head_sum_ms', float('nan')):.1f} ms "
              f"{op.get('head_sum_peak_mib', float('nan')):.0f} MiB", flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rows": rows, "config": args.config}, indent=1))
        print(f"# wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
