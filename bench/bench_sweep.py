"""Short prompts on a deep decoder: one sweep per refinement round against one pass per layer.

A 30-layer Llama-shaped decoder LM (SmolLM2-135M's shape: hidden 576, 9 query / 3 key-value
heads, intermediate 1536, vocab 49152; random weights, seeded, no download), 5-token random
prompts, target: the predicted next token's probability, the default ``--tol 0.1``, every
layer. Both ways score the same prompts in the same process, alternating per prompt, one
thread:

* **sweeps** (the default, engine/sweep.py): every layer's nodes of a refinement round in one
  batch through the stack;
* **per-layer**: one pass per target layer and round (``Scorer.sweep = False``).

Printed: process CPU seconds per prompt of each (median over prompts), their ratio, passes
per prompt, nodes, and the agreement of the maps (max |difference| / max |value| per layer;
the two run the same nodes, so they agree to float rounding). With ``--smollm2 DIR`` (or
ATTATTR_SMOLLM2) also SmolLM2-135M-Instruct itself on "The capital of France is" -> " Paris"
(skipped with one line when neither is given).

    OMP_NUM_THREADS=1 python bench/bench_sweep.py [--prompts 4] [--smollm2 DIR]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.data.types import Example  # noqa: E402
from attattr_cli.engine import sweep  # noqa: E402
from attattr_cli.engine.encoding import Encoded  # noqa: E402
from attattr_cli.engine.options import DEFAULT_TOL, ScoreOptions  # noqa: E402
from attattr_cli.engine.scorer import Scorer  # noqa: E402
from attattr_cli.models.loading import prepare  # noqa: E402

SHAPE = dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
             num_key_value_heads=3, max_position_embeddings=2048, rope_theta=100000.0, tie_word_embeddings=True)


class _Tokens:
    """The little of a tokenizer the scorer needs when inputs are given as ids."""

    def convert_ids_to_tokens(self, ids):
        return [f"t{int(i)}" for i in ids]


def _counted():
    """Patch the two pass functions to count calls; returns the counter."""
    count = [0]
    for owner, name in ((sweep, "_pass"), (Scorer, "_step_chunk")):
        original = getattr(owner, name)

        def counted(*a, _o=original, **k):
            count[0] += 1
            return _o(*a, **k)

        setattr(owner, name, counted)
    return count


def _score(scorer, swept: bool, example, enc, count):
    scorer.sweep = swept
    count[0] = 0
    c0 = time.process_time()
    r = scorer.score(example, enc)
    return r, time.process_time() - c0, count[0]


def _agree(a, b) -> float:
    fa, fb = a.families["self"], b.families["self"]
    return max(float(np.abs(fa.attribution[k].astype(np.float64) - fb.attribution[k]).max()
                     / max(np.abs(fb.attribution[k]).max(), 1e-30)) for k in range(len(fa.layers)))


def compare(name: str, scorer, items, count) -> None:
    rows = {True: [], False: []}
    agree, nodes = [], []
    for example, enc in items:
        got = {}
        for swept in (False, True) if example.index % 2 else (True, False):  # alternate which runs first
            r, cpu, passes = _score(scorer, swept, example, enc, count)
            rows[swept].append((cpu, passes))
            got[swept] = r
        agree.append(_agree(got[True], got[False]))
        nodes.append(int(got[True].families["self"].nodes.sum()))
    cpu = {k: float(np.median([c for c, _ in v])) for k, v in rows.items()}
    passes = {k: float(np.mean([p for _, p in v])) for k, v in rows.items()}
    print(f"{name}: per-layer passes {cpu[False]:.2f} CPU s/prompt ({passes[False]:.0f} passes), sweeps "
          f"{cpu[True]:.2f} CPU s/prompt ({passes[True]:.0f} passes): {cpu[False] / cpu[True]:.2f}x less CPU; "
          f"nodes per prompt {np.mean(nodes):.0f}; max rel difference of the maps {max(agree):.1e}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=5)
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"), help="SmolLM2 model folder")
    args = ap.parse_args()
    import transformers as tf
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    count = _counted()
    options = ScoreOptions(tol=DEFAULT_TOL, lm=True)
    torch.manual_seed(0)
    model = tf.LlamaForCausalLM(tf.LlamaConfig(**SHAPE)).eval()
    scorer = Scorer(prepare(model, _Tokens(), "llama-30-random", lm=True), options)
    gen = torch.Generator().manual_seed(1)
    items = []
    for i in range(args.prompts):
        ids = torch.randint(10, SHAPE["vocab_size"], (args.tokens,), generator=gen).tolist()
        items.append((Example(i, ""), Encoded(ids, [f"t{t}" for t in ids], [0] * len(ids), None,
                                              lm_positions=[len(ids) - 1])))
    print(f"{torch.get_num_threads()} thread(s), fp32, --tol {DEFAULT_TOL}, every layer", flush=True)
    compare(f"30-layer Llama shape, random weights, {args.tokens}-token prompts x {args.prompts}", scorer, items, count)
    if not args.smollm2 or not Path(args.smollm2, "config.json").is_file():
        print(f"SmolLM2: skipped (no model folder: give --smollm2 DIR or ATTATTR_SMOLLM2; got {args.smollm2!r})")
        return
    from attattr_cli.models.loading import load

    loaded = load(args.smollm2, lm=True)
    smol = Scorer(loaded, ScoreOptions(tol=DEFAULT_TOL, lm=True, target_token=" Paris"))
    example = Example(0, "The capital of France is")
    compare("SmolLM2-135M-Instruct, 'The capital of France is' -> ' Paris'", smol, [(example, smol.encode(example))], count)


if __name__ == "__main__":
    main()
