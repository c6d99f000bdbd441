"""Long-context decoder benchmark: attattr vs the 2021 procedure at the same length.

A Qwen2-style decoder LM, randomly initialised from a config (no download), one random
prompt of n tokens per example, target: the probability of the predicted next token at the
last position, m = 20 steps, every layer. Each method runs in its own process so that its
peak memory is its own:

* attattr: ``Scorer.score`` (layers below the target replayed, Q/K/V once, the
  attribution from G V^T, fused attention in the layers above, steps micro-batched to fit);
* 2021: ``tests/slow_reference.py``, the procedure of the 2021 reference code (the whole
  model at batch m for every target layer, the full [m, heads, n, n] probabilities as a
  leaf that requires grad).

Both compute F from the same logits (only the last position goes through the LM head).
Printed: time per example (on CPU also the process's CPU time, steadier than wall time
on a shared machine), peak memory above the loaded model, their ratios, and the
agreement (max |difference| / max |value| of the head-summed attribution, all layers).

CPU (default): 6 layers, hidden 384, 6 query heads sharing 2 key/value heads, n = 512.
``--gpu``: Qwen2-0.5B's config (24 layers, hidden 896, 14 heads / 2 kv heads,
intermediate 4864, vocab 151936, rope theta 1e6, max positions 32768) at n = 2048 and
4096; an out-of-memory error of either method is caught and reported.

    OMP_NUM_THREADS=1 python bench/bench_long_decoder.py            # CPU, n = 512
    python bench/bench_long_decoder.py --gpu                         # one 80 GB GPU
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

CPU_CONFIG = dict(vocab_size=32000, hidden_size=384, intermediate_size=1024, num_hidden_layers=6,
                  num_attention_heads=6, num_key_value_heads=2, max_position_embeddings=4096,
                  rope_theta=10000.0, tie_word_embeddings=True)
QWEN2_05B = dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                 rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True, sliding_window=None,
                 use_sliding_window=False)


class _Tokens:
    """The little of a tokenizer the scorer needs when inputs are given as ids."""

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def child(method: str, n: int, examples: int, steps: int, gpu: bool, dtype: str, out: str,
          config: str = "small", ref_step_batch: int | None = None, step_batch: int | None = None,
          kernel: str = "auto") -> dict:
    import numpy as np
    import torch
    import transformers as tf

    from attattr_cli.data.types import Example
    from attattr_cli.engine.integrate import nodes
    from attattr_cli.engine.encoding import Encoded
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.models.loading import prepare

    device = torch.device("cuda" if gpu else "cpu")
    torch.manual_seed(0)
    cfg = tf.Qwen2Config(**(QWEN2_05B if config == "qwen2-0.5b" else CPU_CONFIG))
    cfg._attn_implementation = "sdpa"
    tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float64": torch.float64}[dtype]
    model = tf.Qwen2ForCausalLM(cfg).to(device=device, dtype=tdtype)
    loaded = prepare(model, _Tokens(), "qwen2-random", lm=True)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, cfg.vocab_size, (n,), generator=gen).tolist() for _ in range(examples)]
    if gpu:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = _rss()
    sums, times, cpu_times, status, oom_at = [], [], [], "ok", []
    try:
        if method == "attattr":
            scorer = Scorer(loaded, ScoreOptions(steps=steps, dtype=dtype, lm=True, keep="sum", step_batch=step_batch,
                                                 kernel=kernel))
            for i, ids in enumerate(prompts):
                enc = Encoded(ids, [f"t{t}" for t in ids], [0] * n, None, lm_positions=[n - 1])
                t0, c0 = time.perf_counter(), time.process_time()
                r = scorer.score(Example(i, ""), enc)
                if gpu:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
                sums.append(r.families["self"].head_sum)
                step_batch = r.step_batch
        else:
            from slow_reference import slow_attribution

            alphas, weights = nodes("right", steps)
            ladder = ref_step_batch == 0  # auto: halve the batch of steps after an out-of-memory error
            step_batch = ref_step_batch or steps
            for ids in prompts:
                inputs = {"input_ids": torch.tensor([ids], device=device)}
                keep = torch.tensor([n - 1], device=device)
                with torch.no_grad():
                    pred = int(model(**inputs, use_cache=False, logits_to_keep=keep).logits[0, 0].argmax())

                def f_of_logits(lg, _p=pred):
                    return torch.softmax(lg[:, 0], -1)[:, _p]

                while True:
                    failed = False
                    if gpu:
                        torch.cuda.reset_peak_memory_stats()
                    t0, c0 = time.perf_counter(), time.process_time()
                    try:
                        ref, _ = slow_attribution(model, inputs, list(range(cfg.num_hidden_layers)), alphas, weights,
                                                  None, f_of_logits=f_of_logits, with_baseline=False,
                                                  step_batch=step_batch,
                                                  more_inputs={"use_cache": False, "logits_to_keep": keep})
                    except torch.OutOfMemoryError:
                        if not ladder or step_batch == 1:
                            raise
                        failed = True
                    if not failed:
                        break
                    oom_at.append(step_batch)
                    gc.collect()
                    torch.cuda.empty_cache()
                    step_batch = (step_batch + 1) // 2
                if gpu:
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                cpu_times.append(time.process_time() - c0)
                sums.append(np.stack([ref[i].sum(0).float().cpu().numpy() for i in sorted(ref)]))
                del ref
    except torch.OutOfMemoryError as exc:
        status = f"out of memory ({str(exc).splitlines()[0][:120]})"
        step_batch = None
    peak = (torch.cuda.max_memory_allocated() - base) if gpu else (_peak_rss() - base)
    if sums:
        np.save(out, sums[0])
    return {"method": method, "n": n, "status": status, "examples": len(times),
            "seconds_per_example": (sum(times) / len(times)) if times else None,
            "cpu_seconds_per_example": (sum(cpu_times) / len(cpu_times)) if cpu_times else None,
            "peak_bytes": peak, "step_batch": step_batch,
            "device": torch.cuda.get_device_name() if gpu else f"cpu ({torch.get_num_threads()} threads)",
            "layers": cfg.num_hidden_layers, "heads": cfg.num_attention_heads,
            "kv_heads": cfg.num_key_value_heads, "hidden": cfg.hidden_size, "steps": steps, "dtype": dtype,
            "config": config, "oom_at_step_batch": oom_at}


def run_child(method: str, n: int, args, tmp: Path) -> dict:
    out = tmp / f"{method}-{n}.npy"
    cmd = [sys.executable, __file__, "--child", method, "--n", str(n), "--examples", str(args.examples),
           "--steps", str(args.steps), "--dtype", args.dtype, "--save", str(out), "--config", args.config] \
        + (["--gpu"] if args.gpu else []) + ["--ref-step-batch", str(args.ref_step_batch)] \
        + (["--steps-per-pass", str(args.step_batch)] if args.step_batch else []) + ["--kernel", args.kernel]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"method": method, "n": n, "status": f"failed: {tail}", "seconds_per_example": None,
                "peak_bytes": None}
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    result["saved"] = str(out) if out.exists() else None
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpu", action="store_true", help="Qwen2-0.5B's config on CUDA at n = 2048 and 4096")
    ap.add_argument("--n", type=int, nargs="*", help="input lengths (default 512 on CPU, 2048 4096 with --gpu)")
    ap.add_argument("--examples", type=int, default=1, help="examples per method and length")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--dtype", default=None, help="float32 (CPU default) or bfloat16 (GPU default)")
    ap.add_argument("--methods", default="attattr,2021")
    ap.add_argument("--config", default=None, choices=["small", "qwen2-0.5b"],
                    help="model config (default: small on CPU, qwen2-0.5b with --gpu)")
    ap.add_argument("--step-batch", type=int, default=None,
                    help="steps per pass for attattr (default: fitted to free memory)")
    ap.add_argument("--kernel", default="auto", help="attattr's kernel backend: auto, cuda or torch")
    ap.add_argument("--ref-step-batch", default=None,
                    help="steps per batch for the 2021 procedure (its code's batch_size): a number, 'all' "
                         "(m at once; CPU default) or 'auto' (m, halved after each out-of-memory error; GPU default)")
    ap.add_argument("--json", default=None, help="also write the results to this JSON file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--save", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.dtype = args.dtype or ("bfloat16" if args.gpu else "float32")
    args.config = args.config or ("qwen2-0.5b" if args.gpu else "small")
    spec = args.ref_step_batch or ("auto" if args.gpu else "all")
    args.ref_step_batch = {"auto": 0, "all": args.steps}.get(spec) if spec in ("auto", "all") else int(spec)
    if args.child:
        print(json.dumps(child(args.child, args.n[0], args.examples, args.steps, args.gpu, args.dtype, args.save,
                               args.config, int(args.ref_step_batch), args.step_batch, args.kernel)))
        return
    import numpy as np

    lengths = args.n or ([2048, 4096] if args.gpu else [512])
    results = []
    gib = 2 ** 30
    with tempfile.TemporaryDirectory() as tmp:
        for n in lengths:
            row = {}
            for method in args.methods.split(","):
                r = run_child(method, n, args, Path(tmp))
                row[method] = r
                results.append(r)
                secs = "-" if r.get("seconds_per_example") is None else f"{r['seconds_per_example']:.1f} s/example"
                if r.get("cpu_seconds_per_example") is not None and not args.gpu:
                    secs += f" (process CPU {r['cpu_seconds_per_example']:.1f} s)"
                mem = "-" if r.get("peak_bytes") is None else f"+{r['peak_bytes'] / gib:.2f} GiB peak"
                if r.get("oom_at_step_batch"):
                    print(f"n={n:5d} {method:8s} out of memory at {', '.join(map(str, r['oom_at_step_batch']))}"
                          " steps per batch", flush=True)
                print(f"n={n:5d} {method:8s} {r['status']:>4s}  {secs}  {mem}  "
                      f"({r.get('config', '')}, {r.get('layers', '?')} layers, step batch {r.get('step_batch')},"
                      f" {r.get('dtype', '')}, {r.get('device', '')})", flush=True)
            a, b = row.get("attattr"), row.get("2021")
            if a and b and a["status"] == "ok" and b["status"] == "ok":
                x, y = np.load(a["saved"]).astype(np.float64), np.load(b["saved"]).astype(np.float64)
                agree = float(np.abs(x - y).max() / np.abs(y).max())
                cpu = "" if args.gpu else \
                    f" (process CPU time {b['cpu_seconds_per_example'] / a['cpu_seconds_per_example']:.2f}x)"
                print(f"n={n:5d} 2021/attattr: time {b['seconds_per_example'] / a['seconds_per_example']:.2f}x{cpu}, "
                      f"peak memory {b['peak_bytes'] / max(a['peak_bytes'], 1):.2f}x; agreement "
                      f"max|diff|/max|2021| = {agree:.1e}", flush=True)
                a["agreement"] = agree
            elif a and b and a["status"] == "ok":
                print(f"n={n:5d} attattr ran all {a.get('layers')} layers; the 2021 procedure: {b['status']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
