"""The first-passage bias of source scores, measured against leave-one-out (docs/long-context.md).

A held-out context of eight invented paragraphs (about 600 tokens in SmolLM2's chat template)
and a question about one of them; the answer is the model's own greedy output. The example is
scored once with ``keep="sum"`` (the head sum [layer, query, key], from which every variant
below is a reduction of the same maps) at a cheap setting (``--steps 2``, one thread), and
leave-one-out removes each passage (one forward each). Printed per passage: leave-one-out's
drop, attattr's score summed over every query row (the method as it was), over the query rows
outside every passage, over the rows after the last passage (the question, the template's tail
and the answer's rows: the method now, which the library's own scores repeat), over each key's
visible queries on average, raw attention, and the attribution of the passage's first token; per variant Kendall's tau-b with
leave-one-out, the rank of leave-one-out's top passage and the drop of removing the variant's
top 1 and top 3.

    ATTATTR_SMOLLM2=./smollm2 OMP_NUM_THREADS=1 python bench/bench_source_bias.py --ask 5
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np

PARAGRAPHS = [
    "The village of Orrin sits at the mouth of a cold green river that the fishermen call the Tallow. Its"
    " houses are built from grey stone cut on the northern cliffs, and every roof is painted a different"
    " shade of blue so that the boats can find their own street from the water at dusk. About four hundred"
    " people live there all year round.",
    "Orrin's bakery is run by a woman named Petra Vell, who rises at three every morning to fire the oven."
    " Her rye loaves are sold in four neighbouring towns, and on market days the queue for her honey buns"
    " stretches past the chapel and the old weighing house. She learned to bake from her grandmother.",
    "The harbour master of Orrin keeps a ledger of every ship that has docked since the flood of 1887. The"
    " largest entry is the whaler Marigold, which stayed for a whole winter after losing its mast in a storm"
    " off the Saltback reef, and paid its debts in whale oil. The ledger is kept in a locked oak chest.",
    "Every autumn the village holds the Lantern Race, in which rowers carry paper lanterns across the bay"
    " without letting the flames go out. Last year the race was won by a fourteen-year-old girl called"
    " Nadia Brook, who crossed the bay in eleven minutes. Her lantern was the only one still burning at the end.",
    "The school in Orrin has only two classrooms and one teacher, Mr. Ansel Grieve, who has taught there"
    " for thirty-one years. He keeps a tortoise named Captain on his desk and is known for reading sea"
    " poems aloud at the start of every lesson. His pupils have painted the classroom door bright yellow.",
    "In the hills above the village there is an abandoned copper mine that closed in 1912. Its entrance is"
    " sealed with an iron gate, and the local children say that on windy nights you can hear the old mine"
    " bell ringing somewhere deep inside the mountain. Nobody has gone inside for many years.",
    "Orrin's lighthouse stands on a rock called the Needle, half a mile from the shore. The keeper, Tomas"
    " Arlo, lives there alone with a grey cat and rows to the village once a week to buy bread, lamp oil"
    " and a newspaper that is always three days old. The light can be seen from twenty miles out at sea.",
    "The village council meets on the first Monday of each month in the back room of the Anchor Inn. Its"
    " current head is Miriam Okoye, a retired ship's doctor who was elected after promising to repair the"
    " sea wall before the winter storms. The repairs began in the spring and are almost finished.",
]
QUESTIONS = {  # passage -> (question, the answer's start given after the template); SmolLM2-135M-Instruct
    3: ("Who won the Lantern Race last year?", "The winner of the Lantern Race was"),  # " a 14-year"
    5: ("In which year did the copper mine close?", "The copper mine closed in"),  # " 1912."
    7: ("Who is the current head of the village council?", "The current head of the village council is"),  # " Miriam Okoye, a"
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("ATTATTR_SMOLLM2", ""))
    ap.add_argument("--ask", type=int, default=5, help="the passage asked about (0-based): " + ", ".join(map(str, QUESTIONS)))
    ap.add_argument("--context", default="orrin", help="orrin (the eight paragraphs here) or towns (bench_long_context.py's)")
    ap.add_argument("--tokens", type=int, default=272, help="with --context towns: about this many tokens")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--answer", type=int, default=6, help="most greedy tokens of the answer (cut at a period)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()

    import torch

    import attattr_cli as aa
    from attattr_cli.analysis.context_check import _answer_logprob, _without, attention_scores
    from attattr_cli.analysis.stats import kendall_tau_b

    torch.set_num_threads(args.threads)
    model = aa.load_model(args.model, lm=True)
    tok = model.tokenizer
    if args.context == "towns":  # bench_long_context.py's numbered passages and question
        import sys
        from pathlib import Path

        sys.path.insert(0, str(Path(__file__).parent))
        from bench_long_context import make_prompt

        text, _parts, args.ask = make_prompt(tok, args.tokens)
    else:
        question, start = QUESTIONS[args.ask]
        user = "\n\n".join(PARAGRAPHS) + f"\n\nQuestion: {question}"
        text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                       add_generation_prompt=True) + start
    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.loaded.model.generate(ids, max_new_tokens=args.answer, do_sample=False,
                                          pad_token_id=tok.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    cut = next((i + 1 for i, t in enumerate(new) if "." in tok.decode([t])), len(new))
    answer = tok.decode(new[:cut])
    print(f"{ids.shape[1]} prompt tokens; asked about passage {args.ask}; answer {answer!r}", flush=True)

    t0 = time.process_time()
    res = aa.score(model, prompts=[text], sources="paragraphs", keep="sum",
                   target=aa.Target(continuation=answer, output="logprob"), integration=aa.Integration(steps=args.steps),
                   compute=aa.Compute(threads=args.threads))[0]
    cpu = time.process_time() - t0
    spans = [{"start": a, "end": b, "text": t} for a, b, t in res.meta["sources"]["spans"]]
    hs = np.asarray(res.head_sum, np.float64)  # [layer, query, key]
    n = hs.shape[-1]
    prompt_ids = ids[0].tolist()
    answer_ids = [int(t) for t in res.meta["lm"]["target_ids"]]
    last_passage_end = spans[-1]["end"]
    in_passage = np.zeros(n, bool)
    for s in spans:
        in_passage[s["start"]:s["end"]] = True

    def per_source(v):
        return [float(v[s["start"]:s["end"]].sum()) for s in spans]

    key_all = hs.sum(axis=(0, 1))  # the method as it was: every query row
    rows_out = ~in_passage  # queries outside every passage: template, question, the answer's rows
    key_out = hs[:, rows_out, :].sum(axis=(0, 1))
    key_after = hs[:, last_passage_end:, :].sum(axis=(0, 1))  # queries after the last passage
    variants = {
        "all rows (as it was)": per_source(key_all),
        "rows outside the passages": per_source(key_out),
        "rows after the passages": per_source(key_after),
        "attattr (the library's scores now)": [float(x) for x in res.to_pandas("sources").score],
        "mean per visible query": [float((key_all[s["start"]:s["end"]] / (n - np.arange(s["start"], s["end"]))).sum())
                                   for s in spans],
    }
    loo = [_answer_logprob(model.loaded.model, prompt_ids, answer_ids)
           - _answer_logprob(model.loaded.model, _without(prompt_ids, spans, {s}), answer_ids) for s in range(len(spans))]
    f_full = _answer_logprob(model.loaded.model, prompt_ids, answer_ids)
    variants["attention (answer rows)"] = attention_scores(model.loaded.model, prompt_ids, answer_ids, spans)
    first_token = [float(key_all[s["start"]]) for s in spans]
    outside_keys = float(key_all[~in_passage].sum())
    print(f"scored in {cpu:.0f} CPU s; log p(answer) {f_full:.3f}; key 0 {key_all[0]:.3f}, keys outside the passages"
          f" {outside_keys:.3f}, passages {key_all[in_passage].sum():.3f}")
    print("\n| passage | LOO drop | " + " | ".join(variants) + " | first token (all rows) |")
    print("|---" * (len(variants) + 3) + "|")
    for k in range(len(spans)):
        print(f"| {k} | {loo[k]:.3f} | " + " | ".join(f"{v[k]:.3f}" for v in variants.values())
              + f" | {first_token[k]:.3f} |")
    best = int(np.argmax(loo))

    def drop(top):
        return f_full - _answer_logprob(model.loaded.model, _without(prompt_ids, spans, set(top)), answer_ids)

    summary = {}
    print("\n| variant | tau with LOO | rank of LOO's top | top-1 | drop top-1 | drop top-3 |")
    print("|---|---|---|---|---|---|")
    for name, v in {"leave-one-out": loo, **variants}.items():
        order = sorted(range(len(v)), key=lambda i: (-v[i], i))
        row = {"tau": float(kendall_tau_b(v, loo)), "rank_of_loo_top": order.index(best) + 1, "top1": order[0],
               "drop1": drop(order[:1]), "drop3": drop(order[:3])}
        summary[name] = row
        print(f"| {name} | {row['tau']:+.2f} | {row['rank_of_loo_top']} | {row['top1']} | {row['drop1']:.3f} |"
              f" {row['drop3']:.3f} |")
    # where in a passage its score sits, and in which layers: passage 0
    s0 = spans[0]
    per_layer0 = hs[:, :, s0["start"]:s0["end"]].sum(axis=(1, 2))
    print(f"\npassage 0: tokens {s0['start']}..{s0['end']}; its first three tokens' share of its score "
          f"{key_all[s0['start']:s0['start'] + 3].sum() / key_all[s0['start']:s0['end']].sum():.2f}; layers with the"
          f" largest |share|: " + ", ".join(f"{int(i)} ({per_layer0[i]:.2f})" for i in np.argsort(-np.abs(per_layer0))[:4]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"ask": args.ask, "answer": answer, "tokens": n, "cpu_s": cpu, "f_full": f_full, "loo": loo,
                       "variants": variants, "first_token": first_token, "summary": summary,
                       "key_sum": key_all.tolist(), "key_sum_rows_out": key_out.tolist(),
                       "spans": [[s["start"], s["end"]] for s in spans],
                       "per_layer_passage0": per_layer0.tolist()}, fh)


if __name__ == "__main__":
    main()
