"""The default for --sources, chosen on some contexts and checked on others (docs/long-context.md).

Contexts (SmolLM2-135M-Instruct's chat template, the answer the model's own greedy output,
at most 6 tokens (``--answer``), cut after the first token with a period unless ``--no-cut``;
the sources are the paragraphs):

* tuning contexts, the ones the rule was chosen on: ``orrin3``, ``orrin5``, ``orrin7``
  (bench_source_bias.py's eight village paragraphs, about 600 tokens, the question about
  paragraph 3, 5 or 7) and ``towns272`` (bench_long_context.py's numbered passages, 272 tokens);
* held-out contexts, written for this check and not run while the rule was chosen:
  ``registry`` (retrieval-style: short factual passages about invented research stations),
  ``story`` (a narrative in paragraphs) and ``mdqa`` (multi-document QA: three documents, a
  question whose answer is in one of them).

Two modes, one context per process (its own peak RSS):

* ``--rules right:1,midpoint:1,gauss:2``: the context scored with each fixed rule
  (``keep="sources"``), then per rule: attattr's top source, the rank of leave-one-out's top,
  Kendall's tau-b with leave-one-out, the drop of log p(answer) when its top 1 / top 3 are
  removed; beside attention's, input x gradient's and leave-one-out's. The rule ``right:2``
  (alpha = 1/2 and 1, equal weights) is also derived as the mean of ``right:1`` and
  ``midpoint:1`` (the integral is linear in its nodes), printed as ``right:2 (derived)``.
* without ``--rules``: the context scored with score's own default for ``--sources`` (no
  integration option given), then ``aa.source_removal``'s check of that result (attattr,
  attention, input x gradient, leave-one-out; top 1 / 3 / 5 removed): CPU s of the scoring and
  of the check, the peak RSS after each.

    ATTATTR_SMOLLM2=./smollm2 OMP_NUM_THREADS=1 python bench/bench_sources_heldout.py \
        --context orrin5 --rules right:1,midpoint:1,gauss:2 --json out.json
    ATTATTR_SMOLLM2=./smollm2 OMP_NUM_THREADS=1 python bench/bench_sources_heldout.py --context story
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_long_context import vm_hwm  # noqa: E402 (the peak RSS, read as that bench reads it)
TUNING = ("orrin3", "orrin5", "orrin7", "towns272")


# held-out contexts: invented facts, so that the model must read them
REGISTRY = [
    "Station Kell is a weather station on the island of Varra. It was built in 1958 and records wind speed every"
    " ten minutes. Its two resident observers are replaced every six months by a supply ship from the mainland.",
    "Station Moravik stands on a glacier 2,300 metres above sea level. Its ice cores reach back forty thousand"
    " years, and the deepest core is stored in a freezer at minus forty degrees. The station is reached by helicopter.",
    "Station Tolle is a marine station on a rocky bay. Its divers count sea urchins along a fixed line every spring,"
    " and its research boat is called the Wren. The station's library holds two thousand books about seaweed.",
    "Station Brann sits in a dry valley with no snow for eleven months of the year. Its main instrument is a"
    " seismometer buried in granite, and it has recorded more than nine thousand small earthquakes since 1974.",
    "Station Orlo is a radio observatory with fourteen dishes arranged in a ring. It listens to pulsars at night"
    " and shuts down every April so that engineers can repaint the dishes white against the sun.",
    "Station Ishvar keeps the northern seed vault, a tunnel cut forty metres into the mountain. The vault holds"
    " samples of 61,000 kinds of barley, wheat and beans, and it is opened only twice a year for new deposits.",
    "Station Pellin studies migrating birds. Each autumn its volunteers fit tiny rings to about three thousand"
    " swallows, and the station's oldest recorded bird, a tern ringed there, was caught again after thirty-four years.",
    "Station Quade measures the ozone above the southern plateau with a balloon launched every Thursday at noon."
    " The balloons are filled with helium and rise for about two hours before they burst at the edge of the sky.",
    "Station Rusk is a field station in a pine forest. Its scientists count the cones on two hundred marked trees"
    " every summer and keep a herd of twelve goats to graze the firebreaks around the laboratory.",
    "Station Ulm studies volcanic gas on the slopes of Mount Eyra. Its sensors send readings of sulphur dioxide"
    " every hour, and the station was evacuated twice, in 1991 and in 2009, when the mountain rumbled.",
    "Station Vesk is a deep-sea station that lowers cameras to the ocean floor four kilometres down. Its best-known"
    " film shows a pale octopus guarding its eggs for more than four years in total darkness.",
    "Station Wyke is a small station on a salt marsh. Its staff measure how fast the marsh grows upward each year"
    " by burying white clay markers, and a wooden walkway of 1,400 planks links the hut to the open water.",
    "Station Yarrow tracks the brown bears of the Serrin valley with collars that report their position every"
    " six hours. The oldest collared bear, a female called Moss, has been followed for nineteen years.",
]
REGISTRY_Q = ("Which station keeps the northern seed vault?", "The northern seed vault is kept at")

STORY = [
    "The clockmaker's shop stood at the end of Lantern Lane, squeezed between a bakery and a shop that sold"
    " nothing but buttons. Its owner, old Ferris Mallow, had mended clocks there for fifty years, and every clock"
    " on his walls was set a few minutes apart, so that the shop chimed for a whole quarter of an hour at noon.",
    "One wet morning in March a girl named Ilse Varga came in out of the rain holding a wooden box. She was"
    " eleven, thin as a broom, and she asked whether Mr. Mallow could mend a clock that had not ticked since her"
    " grandfather died. The clock inside the box was small and green, with a painted moon on its face.",
    "Ferris opened the back of the clock with a tiny screwdriver and found that the spring was not broken at all."
    " Something had been wedged between the wheels to stop them: a folded strip of paper, yellow with age. On it,"
    " in faded ink, was a row of numbers and the words 'under the third stair'.",
    "Ilse ran home through the rain with the paper in her fist. Her grandmother lifted the third stair of the old"
    " house with a kitchen knife, and beneath it, wrapped in an oilcloth, they found a silver key and a photograph"
    " of a young man standing beside a red bicycle in front of a lighthouse.",
    "The key opened nothing in the house. For weeks Ilse tried it in every lock she could find: the garden shed,"
    " the piano lid, her grandmother's jewellery case and even the gate of the churchyard. At last she brought it"
    " back to the clockmaker, who turned it over in his fingers and smiled slowly.",
    "'This is the key of a bank box,' Ferris said, 'from the Harbour Bank in Selmouth, which closed its doors in"
    " 1962. Its boxes were moved to the town museum.' The next Saturday Ilse and her grandmother took the early"
    " train to Selmouth, a journey of three hours along the coast.",
    "At the museum a curator in a grey cardigan led them down to a cellar lined with small steel doors. Box 214"
    " opened with a click. Inside lay a bundle of letters tied with blue ribbon and a gold medal for the long-distance"
    " cycle race of 1951, engraved with her grandfather's name, Anton Varga.",
    "On the train home Ilse read the letters aloud. They were love letters from Anton to her grandmother, written"
    " the summer he cycled around the whole coast, and each ended with the same line: 'I will be home when the"
    " lighthouse blinks twice.' Her grandmother cried, and then she laughed.",
]
STORY_Q = ("What did Ilse and her grandmother find beneath the third stair?", "Beneath the third stair they found")

MDQA = [
    "Document 1 (The Harlow Gazette): The Harlow Canal Festival returned last weekend after a two-year pause. More"
    " than eight thousand visitors watched the barge parade, which was led this year by the restored coal barge"
    " Thistle, painted red and gold for the occasion.",
    "The festival's cooking prize went to Dana Whitcombe for a pie of smoked eel and leeks. The organisers said"
    " that the festival will move to the first weekend of June next year, to avoid the rains of late May.",
    "A new footbridge over the canal, designed by the engineer Paulo Mendes, was opened on the Saturday morning by"
    " the mayor. It is made of weathered steel and is lit from below at night by a row of blue lamps.",
    "Document 2 (Riverside Science Notes): Researchers at the Kestrel Institute have described a freshwater shrimp"
    " that glows faintly green when the water around it is polluted with copper. The shrimp was found in a quarry"
    " lake near the village of Dunmere, where the water is unusually cold and clear.",
    "The discovery was made by a team led by the biologist Dr. Selma Okonkwo, who named the shrimp Gammarus"
    " lumenis. Her team plans to test whether the shrimp could be used to watch for copper in drinking-water"
    " reservoirs, which today requires expensive chemical tests.",
    "The shrimp is about nine millimetres long and lives for roughly fourteen months. Its glow is produced by a"
    " protein in its shell that changes shape when it binds to copper, a mechanism the team described in the"
    " journal Freshwater Biology in January.",
    "The quarry lake itself is privately owned and closed to swimmers. Its owner, a gravel company, has agreed to"
    " let the institute place a floating laboratory on the water for three years, and to keep the lake free of"
    " boats and fishing lines while the shrimp are studied.",
    "Document 3 (Northern Rail Bulletin): The night train between Carrow and Belstead will stop running in"
    " October, the rail company announced on Tuesday. Fewer than forty passengers a night have used it since the"
    " new motorway opened, and the sleeping cars are more than fifty years old.",
    "The company said that a morning express will replace it, leaving Carrow at 6:15 and reaching Belstead before"
    " ten. A group of passengers has collected four thousand signatures asking for the night train to be kept, at"
    " least during the summer months.",
    "The sleeping cars will be sold to a heritage railway in the hills above Carrow, which plans to run them on"
    " its steam excursions. The last night train will leave Carrow on the thirtieth of September at 23:40.",
]
MDQA_Q = ("According to the documents, who led the team that discovered the glowing shrimp?",
          "The team that discovered the glowing shrimp was led by")

HELDOUT = {  # the answers' passages: registry 5 (Station Ishvar), story 3, mdqa 4 (document 2's second paragraph)
    "registry": (REGISTRY,) + REGISTRY_Q,
    "story": (STORY,) + STORY_Q,
    "mdqa": (MDQA,) + MDQA_Q,
}


def prompt_of(tok, name: str) -> str:
    sys.path.insert(0, str(HERE))
    if name.startswith("orrin"):
        from bench_source_bias import PARAGRAPHS, QUESTIONS

        question, start = QUESTIONS[int(name[5:])]
        paragraphs = PARAGRAPHS
    elif name == "towns272":
        from bench_long_context import make_prompt

        return make_prompt(tok, 272)[0]
    else:
        paragraphs, question, start = HELDOUT[name]
    user = "\n\n".join(paragraphs) + f"\n\nQuestion: {question}"
    return tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False,
                                   add_generation_prompt=True) + start


def greedy_answer(model, tok, text: str, most: int = 6, cut: bool = True) -> str:
    import torch

    ids = tok(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        out = model.loaded.model.generate(ids, max_new_tokens=most, do_sample=False, pad_token_id=tok.eos_token_id)
    new = out[0, ids.shape[1]:].tolist()
    end = next((i + 1 for i, t in enumerate(new) if "." in tok.decode([t])), len(new)) if cut else len(new)
    return tok.decode(new[:end])


def order(v):
    return sorted(range(len(v)), key=lambda i: (-v[i], i))


def rules_mode(args, model, tok, text, answer) -> dict:
    import attattr_cli as aa
    from attattr_cli.analysis.context_check import _answer_logprob, _without, attention_scores, input_x_gradient
    from attattr_cli.analysis.stats import kendall_tau_b

    scores, cpu, spans = {}, {}, None
    for spec in args.rules.split(","):
        rule, steps = spec.split(":")
        t0 = time.process_time()
        res = aa.score(model, prompts=[text], sources="paragraphs", keep="sources",
                       target=aa.Target(continuation=answer, output="logprob"),
                       integration=aa.Integration(rule=rule, steps=int(steps)), compute=aa.Compute(threads=1))[0]
        cpu[spec] = time.process_time() - t0
        scores[spec] = [float(x) for x in res.to_pandas("sources").score]
        spans = [{"start": int(a), "end": int(b), "text": t} for a, b, t in res.meta["sources"]["spans"]]
        answer_ids = [int(t) for t in res.meta["lm"]["target_ids"]]
        print(f"{spec}: {cpu[spec]:.0f} CPU s", flush=True)
    if "right:1" in scores and "midpoint:1" in scores:
        scores["right:2 (derived)"] = [(a + b) / 2 for a, b in zip(scores["right:1"], scores["midpoint:1"])]
    net = model.loaded.model
    ids = tok(text)["input_ids"]
    f_full = _answer_logprob(net, ids, answer_ids)
    loo = [f_full - _answer_logprob(net, _without(ids, spans, {s}), answer_ids) for s in range(len(spans))]
    scores["attention"] = attention_scores(net, ids, answer_ids, spans)
    scores["input_x_gradient"] = input_x_gradient(net, ids, answer_ids, spans)
    scores["leave-one-out"] = loo
    cache = {}

    def drop(top):
        key = frozenset(top)
        if key not in cache:
            cache[key] = f_full - _answer_logprob(net, _without(ids, spans, set(top)), answer_ids)
        return cache[key]

    best = order(loo)[0]
    rows = {}
    print(f"\n{len(ids)} prompt tokens, {len(spans)} sources, answer {answer!r}, log p {f_full:.3f}")
    print("| method | CPU s | top 1 | rank of LOO's top | tau with LOO | drop top 1 | drop top 3 | top 3 % of LOO's |")
    print("|---|---|---|---|---|---|---|---|")
    loo3 = drop(order(loo)[:3])
    for name, v in scores.items():
        o = order(v)
        r = {"cpu_s": cpu.get(name), "top1": o[0], "rank_of_loo_top": o.index(best) + 1,
             "tau": float(kendall_tau_b(v, loo)), "drop1": drop(o[:1]), "drop3": drop(o[:3])}
        r["of_loo3"] = r["drop3"] / loo3 if loo3 else float("nan")
        rows[name] = r
        c = "" if r["cpu_s"] is None else f"{r['cpu_s']:.0f}"
        print(f"| {name} | {c} | {r['top1']} | {r['rank_of_loo_top']} | {r['tau']:+.2f} | {r['drop1']:.2f} |"
              f" {r['drop3']:.2f} | {100 * r['of_loo3']:.0f} % |")
    return {"tokens": len(ids), "sources": len(spans), "answer": answer, "f_full": f_full, "scores": scores,
            "rows": rows, "peak_rss": vm_hwm()}


def default_mode(args, model, tok, text, answer) -> dict:
    import attattr_cli as aa
    from attattr_cli.analysis.context_check import check_example
    from attattr_cli.engine.options import integration

    n = len(tok(text)["input_ids"])
    print(f"{args.context}: {n} prompt tokens, answer {answer!r}", flush=True)
    t0 = time.process_time()
    # score's default for --sources: no integration option given
    res = aa.score(model, prompts=[text], sources="paragraphs", keep="sources",
                   target=aa.Target(continuation=answer, output="logprob"), compute=aa.Compute(threads=1))[0]
    score_cpu, score_peak = time.process_time() - t0, vm_hwm()
    rule = integration(None, None, None, "paragraphs")  # what that run resolved to (engine/options.py)
    t1 = time.process_time()
    # aa.source_removal's check on this scored example (it would score it again first)
    check = check_example(model.loaded.model, tok, res)
    check_cpu = time.process_time() - t1
    drops, tau = check.drops, check.agreement
    loo = check.scores["loo"]
    best = order(loo)[0]
    out = {"context": args.context, "tokens": n, "sources": len(check.sources), "answer": answer,
           "f_full": check.f_full, "score_cpu_s": score_cpu, "score_peak_rss": score_peak,
           "check_cpu_s": check_cpu, "peak_rss": vm_hwm(), "rule": rule,
           "scores": check.scores, "drops": drops, "tau": tau,
           "top1": {m: order(v)[0] for m, v in check.scores.items()},
           "rank_of_loo_top": {m: order(v).index(best) + 1 for m, v in check.scores.items()}}
    print(f"scored ({rule}) in {score_cpu:.0f} CPU s (peak {score_peak / 1e9:.2f} GB); the check (attention,"
          f" input x gradient, leave-one-out, removals) {check_cpu:.0f} CPU s; peak {out['peak_rss'] / 1e9:.2f} GB")
    print("| method | top 1 | rank of LOO's top | tau | drop k=1 | k=3 | k=5 | top 3 % of LOO's |")
    print("|---|---|---|---|---|---|---|---|")
    for m, d in drops.items():
        print(f"| {m} | {out['top1'][m]} | {out['rank_of_loo_top'][m]} | {tau[m]:+.2f} | {d[1]:.2f} | {d[3]:.2f} |"
              f" {d[5]:.2f} | {100 * d[3] / drops['loo'][3]:.0f} % |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=os.environ.get("ATTATTR_SMOLLM2", ""))
    ap.add_argument("--context", required=True, help=", ".join(TUNING + tuple(HELDOUT)))
    ap.add_argument("--rules", help="fixed rules to compare, rule:steps,... (the tuning mode)")
    ap.add_argument("--answer", type=int, default=6, help="most greedy tokens of the answer (default 6)")
    ap.add_argument("--no-cut", action="store_true", help="keep all --answer tokens (default: cut after the first"
                    " token with a period, as bench_source_bias.py does; an answer such as ' Dr.' stops there)")
    ap.add_argument("--json", help="also write the numbers here")
    args = ap.parse_args()

    import torch

    import attattr_cli as aa

    torch.set_num_threads(1)
    model = aa.load_model(args.model, lm=True)
    tok = model.tokenizer
    text = prompt_of(tok, args.context)
    answer = greedy_answer(model, tok, text, args.answer, not args.no_cut)
    out = rules_mode(args, model, tok, text, answer) if args.rules else default_mode(args, model, tok, text, answer)
    out["context"] = args.context
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
