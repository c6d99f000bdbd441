"""A generation attributed step by step against one-token runs of each step.

An 8-token prompt and N = 5 greedily generated tokens; for each generated token t the target
is its probability given everything before it. Two ways to get every step's attribution:

* **steps**: one step-by-step run (``--generate``; engine/generation.py): one clean forward of
  the whole sequence, and the alpha-scaled passes of all steps sharing batches (with the
  default ``--tol``, the steps refine in lock-step);
* **separate**: N one-token runs (``--target-token``), one per prefix, in the same process.

Both at the same options (the default tol 0.1, float32, every layer, keep maps). Printed per
model: process CPU time (steadier than wall time on a shared machine) and wall time of each,
their ratio, the peak memory above the loaded model (each way in its own child process, so
that its peak is its own), and the agreement of the per-step head sums (max |difference| /
max |value| over steps and layers; both are within the tolerance of the exact integral).

Models: SmolLM2-135M-Instruct from a plain model folder (``--smollm2 DIR`` or the
ATTATTR_SMOLLM2 environment variable; skipped with one line when absent), and a randomly
initialised tiny Llama config (no download).

    OMP_NUM_THREADS=1 ATTATTR_SMOLLM2=/path/to/smollm2 python bench/bench_generation.py
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT = "Paris is the capital of the country of"  # 8 tokens for SmolLM2's tokenizer
TINY = dict(vocab_size=2000, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=256)


class _Tokens:
    """The little of a tokenizer the scorer needs when inputs are given as ids (the tiny model)."""

    eos_token_id = None

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    """Start the peak resident size (VmHWM) afresh, so that the model's loading is not in it."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _peak_rss() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _load(which: str, folder: str | None):
    import torch
    import transformers as tf

    from attattr_cli.models.loading import prepare

    if which == "smollm2":
        from attattr_cli.models.loading import load

        return load(folder, device="cpu", dtype="float32", lm=True)
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(**TINY)
    cfg._attn_implementation = "sdpa"
    return prepare(tf.LlamaForCausalLM(cfg).eval(), _Tokens(), "llama-tiny-random", lm=True)


def _prompt_ids(loaded, which: str) -> list[int]:
    if which == "smollm2":
        return list(loaded.tokenizer(PROMPT, add_special_tokens=True)["input_ids"])
    import torch

    return torch.randint(10, TINY["vocab_size"], (8,), generator=torch.Generator().manual_seed(1)).tolist()


RULE: dict = {}  # --rule/--steps: a fixed rule instead of the default tol (set by main)
LAYERS: list = []  # --layers: the layers scored (default: all)


def _options(**kw):
    from attattr_cli.engine.options import DEFAULT_TOL, ScoreOptions

    if LAYERS:
        kw["layers"] = list(LAYERS)
    if RULE:
        return ScoreOptions(rule=RULE["rule"], steps=RULE["steps"], **kw)
    return ScoreOptions(tol=DEFAULT_TOL, **kw)


def _ways(loaded, which: str, new: int):
    """(the generation's Encoded, a Scorer for it, [(prefix Encoded) per step], a one-token Scorer)."""
    from attattr_cli.engine.encoding import Encoded
    from attattr_cli.engine.generation import StepwiseScorer, generate
    from attattr_cli.engine.scorer import Scorer

    prompt = _prompt_ids(loaded, which)
    steps = StepwiseScorer(loaded, _options(lm=True, generate=new, keep="maps"))
    gen = generate(steps, prompt, new, None, 0)
    ids = prompt + gen[:-1]
    tok = loaded.tokenizer.convert_ids_to_tokens
    positions = list(range(len(prompt) - 1, len(prompt) - 1 + len(gen)))
    whole = Encoded(ids, tok(ids), [0] * len(ids), None, lm_positions=positions, lm_targets=gen)
    one = Scorer(loaded, _options(lm=True, keep="maps"))
    prefixes = [Encoded(ids[:p + 1], tok(ids[:p + 1]), [0] * (p + 1), None, lm_positions=[p], lm_targets=[g])
                for p, g in zip(positions, gen)]
    return whole, steps, prefixes, one, prompt, gen


def child(which: str, way: str, folder: str | None, new: int) -> dict:
    """One way alone in this process: its peak memory above the loaded model."""
    from attattr_cli.data.types import Example

    loaded = _load(which, folder)
    whole, steps, prefixes, one, _prompt, _gen = _ways(loaded, which, new)
    base = _rss()
    _reset_peak()
    if way == "steps":
        steps.score(Example(0, ""), whole)
    else:
        for enc in prefixes:
            one.score(Example(0, ""), enc)
    return {"peak_above_model": _peak_rss() - base}


def measure(which: str, folder: str | None, new: int) -> dict:
    import numpy as np
    import torch

    from attattr_cli.data.types import Example

    loaded = _load(which, folder)
    whole, steps, prefixes, one, prompt, gen = _ways(loaded, which, new)
    one.score(Example(0, ""), prefixes[0])  # warm-up (one-time costs), not timed
    t0, c0 = time.perf_counter(), time.process_time()
    alone = [one.score(Example(0, ""), enc) for enc in prefixes]
    sep_wall, sep_cpu = time.perf_counter() - t0, time.process_time() - c0
    t0, c0 = time.perf_counter(), time.process_time()
    together = steps.score(Example(0, ""), whole)
    gen_wall, gen_cpu = time.perf_counter() - t0, time.process_time() - c0
    worst = 0.0
    for st, a in zip(together.steps, alone):
        x, y = st.family.attribution.sum(1), a.attribution.sum(1)
        worst = max(worst, float(np.abs(x - y).max() / np.abs(y).max()))
    conv = [int((st.family.status == 0).sum()) for st in together.steps]
    return {"model": which, "layers": loaded.model.config.num_hidden_layers, "prompt_tokens": len(prompt),
            "generated": loaded.tokenizer.convert_ids_to_tokens(gen), "threads": torch.get_num_threads(),
            "separate_cpu": sep_cpu, "separate_wall": sep_wall, "steps_cpu": gen_cpu, "steps_wall": gen_wall,
            "cpu_ratio": gen_cpu / sep_cpu, "agreement": worst, "converged_layers_per_step": conv,
            "step_batch": together.step_batch,
            "max_abs_residual_per_step": [float(np.abs(st.family.residual).max()) for st in together.steps]}


def _child_peak(which: str, way: str, folder: str | None, new: int) -> int | None:
    cmd = [sys.executable, __file__, "--child", which, way, "--new", str(new)] + (["--smollm2", folder] if folder else []) \
        + (["--rule", RULE["rule"], "--steps", str(RULE["steps"])] if RULE else []) \
        + (["--layers", ",".join(map(str, LAYERS))] if LAYERS else [])
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])["peak_above_model"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"), help="SmolLM2 model folder")
    ap.add_argument("--new", type=int, default=5, help="tokens generated")
    ap.add_argument("--models", default="tiny,smollm2")
    ap.add_argument("--no-memory", action="store_true", help="skip the child processes that measure memory")
    ap.add_argument("--memory-only", action="store_true", help="only the memory of each way (child processes)")
    ap.add_argument("--rule", default=None, help="a fixed rule (with --steps) instead of the default --tol 0.1")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--layers", default=None, help="layers to score, e.g. 0 or 0,5 (default: all)")
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.rule or args.steps:
        RULE.update(rule=args.rule or "right", steps=args.steps or 20)
    if args.layers:
        LAYERS.extend(int(x) for x in args.layers.split(","))
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.smollm2, args.new)))
        return
    for which in args.models.split(","):
        if which == "smollm2" and not (args.smollm2 and Path(args.smollm2, "config.json").is_file()):
            print("smollm2: skipped (no model folder: pass --smollm2 DIR or set ATTATTR_SMOLLM2)")
            continue
        r = None if args.memory_only else measure(which, args.smollm2, args.new)
        how = (f"{RULE['rule']} m = {RULE['steps']}" if RULE else "tol 0.1") + (
            f", layers {','.join(map(str, LAYERS))}" if LAYERS else "")
        if r is not None:
            print(f"{which} [{how}] ({r['layers']} layers, {r['prompt_tokens']}-token prompt, {args.new} generated"
                  f" {r['generated']}, {r['threads']} thread): {args.new} separate one-token runs"
                  f" {r['separate_cpu']:.2f} s CPU ({r['separate_wall']:.2f} s wall); step by step"
                  f" {r['steps_cpu']:.2f} s CPU ({r['steps_wall']:.2f} s wall): ratio {r['cpu_ratio']:.2f};"
                  f" agreement {r['agreement']:.1e}; converged layers per step {r['converged_layers_per_step']};"
                  f" max |residual| per step {' '.join(f'{x:.1e}' for x in r['max_abs_residual_per_step'])}")
        if not args.no_memory:
            sep, steps = (_child_peak(which, way, args.smollm2, args.new) for way in ("separate", "steps"))
            if sep is not None and steps is not None:
                print(f"{which} [{how}]: peak memory above the model: separate {sep / 2**20:.1f} MiB,"
                      f" step by step {steps / 2**20:.1f} MiB")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
