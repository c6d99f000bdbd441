"""Long contexts: a question answered from numbered passages, its answer explained per source.

Per configuration (model x context length), in a child process of its own:

* the prompt: numbered passages (one fact each: a town, its mayor, its river, its founding
  year) separated by blank lines until the context has about T tokens, then a question about
  one passage, in the model's chat template; the model's own 5-token greedy answer is the
  continuation; the sources are the passages, given as a JSONL file;
* ``score(..., continuation=answer, sources=FILE, output="logprob", keep="sources")``:
  CPU seconds, wall seconds and the peak RSS (VmHWM) of the child, the store's size, the
  estimate said before the run (engine/budget.py) and the estimated store size of every
  ``--keep`` mode, the convergence of the layers;
* the source-removal check (analysis/context_check.py): the drop of the answer's
  log-probability when each method's top-1/3/5 sources are removed, beside leave-one-out's.

Models: SmolLM2-135M-Instruct (``--smollm2 DIR`` or ATTATTR_SMOLLM2, when given) and a
random Llama of the same shape (30 layers, 9 heads, hidden 576; SmolLM2's tokenizer, or the
built-in default's where SmolLM2 is absent). All configurations:

    OMP_NUM_THREADS=1 python bench/bench_long_context.py
    python bench/bench_long_context.py --models smollm2 --tokens 256,1024 --threads 1 --json out.json

Goals of the issue it answers (docs/long-context.md): SmolLM2 at 1,024 tokens, one thread,
<= 10 CPU minutes and <= 4 GB peak; 2,048 tokens within 8 GB; removing attattr's top-3
sources lowers log p at least 90 % as much as leave-one-out's top 3, and more than attention's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = os.environ.get("ATTATTR_SMOLLM2", "")
TOWNS = ["Arden", "Belmar", "Corvin", "Dunmore", "Elbury", "Fenwick", "Garrow", "Halston", "Ivel", "Jarrow",
         "Kelby", "Lorne", "Marden", "Norwood", "Orton", "Pellam", "Quarry", "Rosslyn", "Selby", "Tarn",
         "Ulver", "Varden", "Wexley", "Yarrow", "Zennor"]
NAMES = ["Ana Ruiz", "Ben Okafor", "Clara Holm", "David Sato", "Emma Novak", "Farid Haddad", "Grace Lin",
         "Hugo Berg", "Ines Costa", "Jonas Weber", "Kira Patel", "Luis Moreno", "Mia Jensen", "Noah Fischer",
         "Olga Petrov", "Paul Dubois", "Rosa Silva", "Sam Carter", "Tara Singh", "Uma Rossi"]
RIVERS = ["Elm", "Ash", "Bree", "Cole", "Dove", "Esk", "Fal", "Gade", "Hull", "Isis", "Kent", "Lune"]


def passage(i: int) -> str:
    town = TOWNS[i % len(TOWNS)] + ("" if i < len(TOWNS) else f" {i // len(TOWNS) + 1}")
    return (f"Passage {i + 1}: The town of {town} lies on the river {RIVERS[i % len(RIVERS)]}. It was founded in"
            f" {1500 + 37 * i % 400}, and its mayor is {NAMES[(7 * i + 3) % len(NAMES)]}.")


def make_prompt(tokenizer, tokens: int) -> tuple[str, list[str], int]:
    """Numbered passages up to about ``tokens`` tokens and a question about one near the middle,
    in the model's chat template where it has one: (prompt, passages, the passage asked about)."""
    parts, i = [], 0
    while True:
        parts.append(passage(i))
        i += 1
        ask = i // 2
        town = passage(ask).split("town of ")[1].split(" lies")[0]
        user = "\n\n".join(parts) + f"\n\nQuestion: Who is the mayor of {town}? Answer with the name."
        if getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                                 add_generation_prompt=True) + f"The mayor of {town} is"
        else:
            text = user + f"\nAnswer: The mayor of {town} is"
        if len(tokenizer(text)["input_ids"]) >= tokens - 5:
            return text, parts, ask


def random_llama(folder: Path, tokenizer_from: str | None) -> str:
    """A randomly initialised Llama of SmolLM2-135M's shape (30 layers, 9 heads, hidden 576)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if tokenizer_from is None:
        from attattr_cli.models.default import DEFAULT_MODEL_DIR

        tokenizer_from = str(DEFAULT_MODEL_DIR)
    tok = AutoTokenizer.from_pretrained(tokenizer_from)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                      num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                      rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                      eos_token_id=tok.eos_token_id)
    model = LlamaForCausalLM(cfg)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def vm_hwm() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def child(cfg: dict) -> dict:
    """One configuration, in this process (its own peak RSS)."""
    import numpy as np
    import torch

    import attattr_cli as aa
    from attattr_cli.analysis.context_check import check_example
    from attattr_cli.engine import budget
    from attattr_cli.engine.options import ScoreOptions, integration
    from attattr_cli.engine.run import scorer_for
    from attattr_cli.data.types import Example

    t_wall, t_cpu = time.perf_counter(), time.process_time()
    model = aa.load_model(cfg["model"], lm=True)
    tok = model.tokenizer
    text, parts, asked = make_prompt(tok, cfg["tokens"])
    sources = str(Path(cfg["out"]).with_suffix(".passages.jsonl"))  # the passages, given: --sources FILE
    Path(sources).write_text("".join(json.dumps({"text": p}) + "\n" for p in parts))
    if cfg["threads"]:  # 0: attattr's own choice (engine/threads.py), torch's default for the rest
        torch.set_num_threads(cfg["threads"])
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.model.generate(ids, max_new_tokens=cfg["answer"], min_new_tokens=cfg["answer"],
                                   do_sample=False, pad_token_id=tok.eos_token_id)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=False)
    load_cpu = time.process_time() - t_cpu
    estimates = {}
    # what was given (neither: score's own default for --sources) and what score resolves it to
    rule = {k: cfg[k] for k in ("steps", "tol") if cfg.get(k) is not None}
    resolved = integration(cfg.get("steps"), None, cfg.get("tol"), sources)
    per_step = cfg.get("per_step", False)
    sc = scorer_for(model.loaded, ScoreOptions(**resolved, lm=True, continuation=answer, keep="sources", output="logprob",
                                               sources=sources, per_step=per_step))
    enc = sc.encode(Example(0, text))
    for keep in ("maps", "sum", "sources"):
        e = budget.estimate(sc, enc, 0, keep)
        estimates[keep] = {"peak": e.peak, "store": e.store}
    heard = []
    store = Path(cfg["out"])
    t0w, t0c = time.perf_counter(), time.process_time()
    aa.score(model, prompts=[text], continuation=answer, sources=sources, output="logprob",
             keep="sources", threads=cfg["threads"] or None, out=store, notify=heard.append,
             per_step=per_step, **rule)
    score_wall, score_cpu = time.perf_counter() - t0w, time.process_time() - t0c
    # the count score chose and used, as its estimate line says ("...; N threads", engine/run.py)
    said = re.search(r"; (\d+) threads?$", heard[-1]) if heard else None
    chosen = int(said.group(1)) if said else None
    peak_after_score = vm_hwm()
    e = aa.open_store(store)[0]
    table = e.to_pandas("sources")
    t1c = time.process_time()
    check = check_example(model.loaded.model, tok, e) if cfg["check"] else None
    check_cpu = time.process_time() - t1c
    return {
        **{k: cfg[k] for k in ("name", "tokens", "threads", "tol", "steps")}, "per_step": per_step,
        "integration": resolved,
        "threads_used": chosen,
        "n_tokens": len(e.tokens), "sources": len(table), "asked_passage": asked, "answer": answer,
        "score_cpu_s": score_cpu, "score_wall_s": score_wall, "load_cpu_s": load_cpu, "check_cpu_s": check_cpu,
        "total_cpu_s": time.process_time() - t_cpu, "total_wall_s": time.perf_counter() - t_wall,
        "peak_rss_score": peak_after_score, "peak_rss": vm_hwm(), "store_bytes": store.stat().st_size,
        "estimate_said": heard, "estimates": estimates,
        "converged_layers": int(np.sum(np.asarray(e.convergence) == 0)), "layers": len(e.layers),
        "nodes_mean": float(np.mean(e.nodes)) if e.nodes is not None else None,
        "max_abs_residual": float(np.max(np.abs(e.residual))), "f_full": float(e.f_full),
        "top_sources": table.sort_values("score", ascending=False).source.head(5).tolist(),
        "drops": None if check is None else {m: {str(k): v for k, v in d.items()} for m, d in check.drops.items()},
        "tau_loo": None if check is None else check.agreement,
    }


def run_config(cfg: dict, timeout: float) -> dict:
    """A configuration in a child process; its CPU time from the OS as well."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("OMP_NUM_THREADS", None)
    if cfg["threads"]:
        env["OMP_NUM_THREADS"] = str(cfg["threads"])
    try:
        p = subprocess.run([sys.executable, __file__, "--child", json.dumps(cfg)], capture_output=True, text=True,
                           timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return {**cfg, "error": f"over the {timeout:.0f} s limit"}
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        return {**cfg, "error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["child_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    res["child_wall_s"] = time.perf_counter() - t0
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--models", default="smollm2,random30", help="smollm2, random30 (comma-separated)")
    ap.add_argument("--tokens", default="256,1024,2048")
    ap.add_argument("--threads", default="1",
                    help="thread counts to run (comma-separated); 0: attattr's own choice (engine/threads.py)")
    ap.add_argument("--answer", type=int, default=5, help="generated answer tokens")
    ap.add_argument("--smollm2", default=SMOLLM2)
    ap.add_argument("--no-check", action="store_true", help="leave out the source-removal check")
    ap.add_argument("--tol", type=float, default=None, help="the integration's tolerance (score's error-controlled run"
                    " is --tol 0.1)")
    ap.add_argument("--steps", type=int, default=None, help="a fixed rule of this many nodes instead of --tol (neither:"
                    " score's own default for --sources, engine/options.py SOURCES_RULE and SOURCES_STEPS)")
    ap.add_argument("--per-step", action="store_true", help="attribute each answer token given what comes before it "
                    "(a generation step by step) instead of the answer's joint log-probability")
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    with tempfile.TemporaryDirectory(prefix="bench-long-") as tmp:
        have_smol = Path(args.smollm2, "config.json").exists()
        models = {}
        for name in args.models.split(","):
            if name == "smollm2":
                if have_smol:
                    models[name] = args.smollm2
                else:
                    print(f"SmolLM2: left out (no model folder: give --smollm2 DIR or ATTATTR_SMOLLM2; got {args.smollm2!r})", file=sys.stderr)
            elif name == "random30":
                models[name] = random_llama(Path(tmp, "random30"), args.smollm2 if have_smol else None)
        rows = []
        for name, path in models.items():
            for t in [int(x) for x in args.tokens.split(",")]:
                for th in [int(x) for x in args.threads.split(",")]:
                    cfg = {"name": name, "model": path, "tokens": t, "threads": th, "answer": args.answer,
                           "check": not args.no_check, "out": str(Path(tmp, f"{name}-{t}-{th}.h5")),
                           "tol": args.tol, "steps": args.steps, "per_step": args.per_step}
                    r = run_config(cfg, args.timeout)
                    rows.append(r)
                    print(json.dumps(r), flush=True)
    print_table(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


def print_table(rows) -> None:
    from attattr_cli.engine.budget import human

    print("\n| model | tokens | threads | sources | CPU s (score) | wall s (score) | peak RSS | estimate | store |"
          " est. store maps / sum | converged | drop top-3: attattr / attention / x-grad / LOO |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['name']} | {r['tokens']} | {r['threads']} | error: {r['error']} |")
            continue
        d = r["drops"] or {}
        top3 = " / ".join(f"{d[m]['3']:.2f}" if m in d else "-" for m in ("attattr", "attention", "input_x_gradient", "loo"))
        est = r["estimates"]
        th = f"{r['threads']}" if r["threads"] else f"default ({r['threads_used']})"
        print(f"| {r['name']} | {r['n_tokens']} | {th} | {r['sources']} | {r['score_cpu_s']:.0f} |"
              f" {r['score_wall_s']:.0f} | {human(r['peak_rss'])} | {human(est['sources']['peak'])} |"
              f" {human(r['store_bytes'])} | {human(est['maps']['store'])} / {human(est['sum']['store'])} |"
              f" {r['converged_layers']}/{r['layers']} | {top3} |")


if __name__ == "__main__":
    main()
