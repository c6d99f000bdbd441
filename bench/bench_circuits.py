"""Which heads carry a behaviour: every head method judged by MIB's node-level yardstick.

For each model and task: counterfactual pairs from attattr's generators, every registered
head method (or ``--methods``), and per method CPR (higher is better), CMD (lower is
better), the Spearman correlation of its head scores with exact patching, how many of the
top ten heads it shares with exact patching, and its process CPU seconds per pair, all in one
run, one thread. Models:

* a tiny Llama (2 layers x 4 heads, a word-level tokenizer made here) trained here for a few
  hundred steps on the task's clean prompts, so that it has a behaviour: always;
* SmolLM2-135M-Instruct (30 layers x 9 heads) with ``--smollm2 DIR`` or ATTATTR_SMOLLM2
  (skipped with one line when neither is given).

    OMP_NUM_THREADS=1 python bench/bench_circuits.py [--pairs 32] [--tasks ioi,capitals] [--smollm2 DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from attattr_cli.analysis import circuits  # noqa: E402
from attattr_cli.analysis.circuits.run import evaluate  # noqa: E402
from attattr_cli.analysis.circuits.split import split_pairs  # noqa: E402
from attattr_cli.analysis.circuits.task import CircuitTask, Context  # noqa: E402
from attattr_cli.data import pair_tasks, pairs as pairs_mod  # noqa: E402


def word_tokenizer():
    """A word-level tokenizer over the generators' words (no download)."""
    import re

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from attattr_cli.data.pair_tasks import capitals, ioi

    words = set()
    for t in ioi.IOI_TEMPLATES:
        words.update(re.findall(r"\w+|[^\w\s]", re.sub(r"\{\w+\}", " ", t)))
    words.update(pairs_mod.NAMES + ioi.PLACES + ioi.OBJECTS)
    for item in capitals.COUNTRIES:
        words.update(re.findall(r"\w+|[^\w\s]", " ".join(item)))
    vocab = {"[UNK]": 0, "[BOS]": 1}
    for w in sorted(words):
        vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", bos_token="[BOS]")


def tiny_llama(task: str):
    import transformers as tf

    from attattr_cli.models.loading import prepare

    tok = word_tokenizer()
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64)
    model = tf.LlamaForCausalLM(cfg)
    train(model, tok, task)
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return prepare(model, tok, f"llama-tiny-trained-{task}", lm=True)


def train(model, tok, task: str, steps: int = 400, batch: int = 32) -> None:
    """A few hundred Adam steps on the task's clean prompts (loss on the answer token only), so
    that the tiny model has a behaviour for its heads to carry."""
    pairs = pair_tasks.generate(task, tok, 2000, seed=123)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    model.train()
    by_len: dict = {}
    for p in pairs:  # batches of one length: no padding
        ids = tok(p.prompt)["input_ids"]
        by_len.setdefault(len(ids), []).append((ids, tok(p.answer[0], add_special_tokens=False)["input_ids"][0]))
    groups = [v for v in by_len.values() if len(v) >= batch]
    for step in range(steps):
        group = groups[step % len(groups)]
        idx = torch.randint(0, len(group), (batch,), generator=g).tolist()
        ids = torch.tensor([group[i][0] for i in idx])
        logits = model(input_ids=ids).logits[:, -1]
        loss = torch.nn.functional.cross_entropy(logits, torch.tensor([group[i][1] for i in idx]))
        opt.zero_grad()
        loss.backward()
        opt.step()


def smollm2(folder: str):
    from attattr_cli.models.loading import load

    loaded = load(folder, device="cpu", dtype="float32", lm=True)
    for p in loaded.model.parameters():
        p.requires_grad_(False)
    return loaded


def run(loaded, label: str, task: str, n: int, methods, steps, bootstrap: int, seed: int = 1,
        nodes: str = "heads", split: str = "half", verify: int | None = None) -> dict:
    try:
        pairs = pair_tasks.generate(task, loaded.tokenizer, n, seed=seed)
    except Exception as exc:  # a task this tokenizer cannot make (names of several tokens)
        print(f"{label} {task}: skipped ({exc})")
        return {}
    parts = split_pairs(len(pairs), split, seed)
    make = lambda idx: CircuitTask(loaded, [pairs[i] for i in idx], mlp=nodes == "heads+mlp")  # noqa: E731
    ct = make(parts.eval)
    ctx = Context(ct, steps=steps, verify=verify)
    fit = ctx if parts.same else Context(make(parts.fit), steps=steps, verify=verify)
    t = time.time()
    res = evaluate(ctx, methods, bootstrap_samples=bootstrap, fit=fit)
    wall = time.time() - t
    mlp = " + MLP" if ct.width > ct.heads else ""
    scale = fit.cache.get("atp-verified scale")
    print(f"\n{label}, {task}: {n} pairs (seed {seed}; {parts.describe()}), {ct.layers} layers x {ct.heads} heads{mlp}, "
          f"m(N) {res.clean:.3f}, m(empty) {res.empty:.3f}, {wall:.0f} s wall"
          + ("" if scale is None else f"; atp-verified chose c = {scale:g}"))
    print(f"{'method':<17}{'CPR':>7}{'CMD':>7}  {'CMD 95% CI':<16}{'Spearman':>9}{'top10':>6}{'CPU s/pair':>11}  completeness")
    rows = {}
    for name, r in res.methods.items():
        sp = "" if r.spearman is None else f"{r.spearman:.3f}"
        top = "" if r.top10_shared is None else str(r.top10_shared)
        comp = "" if r.completeness is None else f"{r.completeness:.3f}"
        print(f"{name:<17}{r.cpr:>7.3f}{r.cmd:>7.3f}  [{r.cmd_interval[0]:.3f}, {r.cmd_interval[1]:.3f}]"
              f"{sp:>9}{top:>6}{r.cpu_s_per_pair:>11.2f}  {comp}")
        rows[name] = {"cpr": r.cpr, "cmd": r.cmd, "spearman": r.spearman, "top10": r.top10_shared,
                      "cpu_s_per_pair": r.cpu_s_per_pair, "curve": r.curve, "curve_abs": r.curve_abs}
    return {"model": label, "task": task, "pairs": n, "seed": seed, "split": parts.to_dict(), "nodes": nodes,
            "m_clean": res.clean, "m_empty": res.empty, "atp_verified_scale": scale, "methods": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--tasks", default="ioi,capitals")
    ap.add_argument("--methods", default="all")
    ap.add_argument("--steps", type=int, default=None)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=1, help="the pairs' seed (1: not the pairs the methods were designed on, seed 0)")
    ap.add_argument("--smollm2", default=os.environ.get("ATTATTR_SMOLLM2"))
    ap.add_argument("--no-tiny", action="store_true", help="only SmolLM2")
    ap.add_argument("--json", default=None, help="also write every figure as JSON")
    ap.add_argument("--nodes", default="heads", help="heads, or heads+mlp (each layer's MLP one more node)")
    ap.add_argument("--split", default="half", help="MIB's protocol: half (default), a fraction, or none (same pairs)")
    ap.add_argument("--verify", type=int, default=None, help="heads of largest |AtP| patched exactly (default 15)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    methods = circuits.parse_methods(args.methods)
    tasks = [t for t in args.tasks.split(",") if t]
    missing = [t for t in tasks if t not in pairs_mod.PAIR_TASKS]
    if missing:
        print(f"tasks without a generator here: {', '.join(missing)} (available: {', '.join(pairs_mod.PAIR_TASKS)})")
        tasks = [t for t in tasks if t in pairs_mod.PAIR_TASKS]
    print(f"methods: {', '.join(methods)}; recommended: {circuits.RECOMMENDED}; one thread, process CPU seconds")
    out = []
    if not args.no_tiny:
        for t in tasks:
            tiny = tiny_llama(t)
            out.append(run(tiny, "tiny Llama trained here", t, min(args.pairs, 16), methods, args.steps, args.bootstrap,
                           args.seed, args.nodes, args.split, args.verify))
    if args.smollm2 and Path(args.smollm2).is_dir():
        model = smollm2(args.smollm2)
        for t in tasks:
            out.append(run(model, "SmolLM2-135M", t, args.pairs, methods, args.steps, args.bootstrap, args.seed,
                           args.nodes, args.split, args.verify))
    else:
        print(f"\nSmolLM2: skipped (no model folder: give --smollm2 DIR or ATTATTR_SMOLLM2; got {args.smollm2!r})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
