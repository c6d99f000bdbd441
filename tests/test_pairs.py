"""Counterfactual pairs as data (data/pairs.py): the generators for any tokenizer, `attattr demo
data --task`, pairs scored each with its own answer and foil into one store (merge, resume,
save), and head importance and pruning of such a store."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from attattr_cli.data import pair_tasks as T, pairs as P
from attattr_cli.errors import DataError
from conftest import one_error_line, run_cli
from tiny_bpe import MISSING, save_bpe_tokenizer

SMOLLM2 = os.environ.get("ATTATTR_SMOLLM2", "")  # SmolLM2's folder, as the benches take it


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE tokenizer with one token per digit (as SmolLM2's)."""
    return save_bpe_tokenizer(tmp_path_factory.mktemp("bpe_digits"))


@pytest.fixture(scope="session")
def bpe(bpe_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_dir)


@pytest.fixture(scope="session")
def bpe_two(tmp_path_factory):
    """The same with a token for every two-digit number (as GPT-2's years)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_bpe_tokenizer(tmp_path_factory.mktemp("bpe_two"), two_digit_years=True))


@pytest.fixture(scope="session")
def lm_dir(tmp_path_factory, bpe_dir, bpe):
    """A tiny random Llama causal LM saved with the BPE tokenizer: loadable by path."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(bpe), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=37, max_position_embeddings=64,
                         bos_token_id=2, eos_token_id=3, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # a random model's logits spread out: the metrics are not all near zero
    d = tmp_path_factory.mktemp("tiny_llama_bpe")
    model.eval().save_pretrained(d)
    bpe.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def ioi_file(tmp_path_factory, lm_dir):
    out = tmp_path_factory.mktemp("pairs") / "ioi.jsonl"
    r = run_cli("demo", "data", "--task", "ioi", "--model", lm_dir, "--count", 6, "--seed", 3, "--out", out)
    assert r.exit_code == 0, r.output
    return out


def _direct_metric(model, tokenizer, pair: P.Pair, metric: str, dtype=torch.float32) -> float:
    """The pair's metric from one plain forward of the clean prompt (no attattr code but the
    token lookup): the test's own definition of engine/metrics.py."""
    ids = tokenizer(pair.prompt)["input_ids"]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].to(dtype)
    a = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t))[0] for t in pair.answer]
    f = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(t))[0] for t in pair.foil]
    if metric == "logit-diff":
        return float(logits[a].mean() - logits[f].mean())
    p = torch.softmax(logits, -1)
    if metric == "prob":
        return float(p[a].sum())
    return float(torch.log(p[a].sum()) - torch.log(p[f].sum()))


# -- generators -------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["ioi", "greater-than", "capitals", "copying", "pronoun", "agreement", "mcq"])
@pytest.mark.parametrize("two", [False, True], ids=["digits", "two-digit"])
def test_generators_make_checked_pairs_for_any_tokenizer(task, two, bpe, bpe_two):
    tok = bpe_two if two else bpe
    made = T.generate(task, tok, 12, seed=5)
    assert len(made) == 12 and [p.index for p in made] == list(range(12))
    assert [p.to_json() for p in T.generate(task, tok, 12, seed=5)] == [p.to_json() for p in made]  # seeded
    assert [p.to_json() for p in T.generate(task, tok, 12, seed=6)] != [p.to_json() for p in made]
    for p in made:
        enc = P.encode_pair(tok, p)  # equal lengths and one-token answers and foils, or it raises
        assert len(enc.clean) == len(enc.counterfactual) and enc.answer and enc.foil
        assert not set(enc.answer) & set(enc.foil)
        assert p.meta["task"] == task
    if task == "capitals":
        assert not {" " + c for c in MISSING} & {t for p in made for t in p.answer + p.foil}
        capital = dict(T.capitals.COUNTRIES)
        for p in made:  # the foil is the counterfactual country's capital, another city
            country = next(c for c in capital if p.counterfactual == p.prompt.replace(
                next(k for k in capital if " " + capital[k] == p.answer[0]), c))
            assert p.foil == (" " + capital[country],) and p.foil != p.answer
    if task == "copying":  # the clean prompt names the answer's surname, the counterfactual the foil's
        for p in made:
            assert p.counterfactual == p.prompt.replace(p.answer[0], p.foil[0], 1) != p.prompt
    if task == "pronoun":  # the counterfactual names someone of the other gender
        for p in made:
            name = lambda text: next(w.strip(",") for w in text.split() if w.strip(",") in T.pronoun.MALE + T.pronoun.FEMALE)  # noqa: E731
            assert (name(p.prompt) in T.pronoun.FEMALE) == (p.answer == (" she",)) != (name(p.counterfactual) in T.pronoun.FEMALE)
    if task == "agreement":  # the verb agrees with the subject, and the counterfactual flips its number
        plural = {b for _, b in T.agreement.AGREEMENT_NOUNS}
        for p in made:
            assert (p.prompt.split()[1] in plural) == (p.answer == (" are",)) != (p.counterfactual.split()[1] in plural)
    if task == "mcq":  # the same options in another order: the right one's letter moves to the foil's
        def options(text):  # {"A": word, "B": word, "C": word}
            body = text.split("? ")[1].split(" Answer")[0].split()
            return {body[i][0]: body[i + 1] for i in range(0, len(body), 2)}

        for p in made:
            clean, cf = options(p.prompt), options(p.counterfactual)
            right = next(w for w in clean.values() if w in T.mcq.MCQ_CATEGORIES[p.meta["category"]])
            assert " " + next(k for k, w in clean.items() if w == right) == p.answer[0]
            assert " " + next(k for k, w in cf.items() if w == right) == p.foil[0]
            assert sorted(clean.values()) == sorted(cf.values()) and p.answer != p.foil
    if task == "greater-than":
        for p in made:
            year = p.meta["year"]
            assert p.prompt.endswith(f"to the year {p.prompt.split('year ')[1][:2]}")
            assert p.counterfactual == p.prompt.replace(f"{year:02d} to", "01 to")
            if two:
                assert p.meta["digits"] == "two"
                assert [int(t) for t in p.answer] == list(range(year + 1, 100))
                assert [int(t) for t in p.foil] == list(range(0, year + 1))
            else:
                assert p.meta["digits"] == "one"
                assert [int(t) for t in p.answer] == list(range(year // 10 + 1, 10))
                assert [int(t) for t in p.foil] == list(range(0, year // 10))


def test_greater_than_sets_and_year_tokens(bpe, bpe_two):
    assert T.greater_than.greater_than_sets(32, "two") == ([f"{y:02d}" for y in range(33, 100)], [f"{y:02d}" for y in range(33)])
    assert T.greater_than.greater_than_sets(32, "one") == ([str(d) for d in range(4, 10)], ["0", "1", "2"])
    assert T.greater_than.year_tokens(bpe)[0] == "one" and T.greater_than.year_tokens(bpe_two)[0] == "two"


def test_a_tokenizer_without_the_words_is_one_clear_error(tokenizer):
    for task, text in (("ioi", "IOI names are one token"), ("capitals", "capitals are one token"),
                       ("greater-than", "greater-than task needs")):
        with pytest.raises(DataError, match=text):
            T.generate(task, tokenizer, 3)


def test_pairs_read_back_and_bad_pairs_name_the_line(tmp_path, bpe):
    made = T.generate("capitals", bpe, 4, seed=1)
    f = tmp_path / "c.jsonl"
    P.write_pairs(f, made)
    back = P.read_pairs(f)
    assert [p.to_json() for p in back] == [p.to_json() for p in made] and P.is_pairs_file(f)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "The capital of France is", "counterfactual": "The capital of Germany is",
                               "answer": " Paris", "foil": " Paris"}) + "\n")
    with pytest.raises(DataError, match="line 1"):
        P.read_pairs(bad)
    uneven = P.Pair(7, "The capital of France is", "The capital city of Spain is", (" Paris",), (" Madrid",))
    with pytest.raises(DataError, match="pair 7: the prompt has 6 tokens and the counterfactual 7"):
        P.encode_pair(bpe, uneven)


@pytest.mark.skipif(not os.path.isdir(SMOLLM2), reason="SmolLM2's folder is not named by ATTATTR_SMOLLM2")
def test_generators_with_smollm2_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    assert T.greater_than.year_tokens(tok)[0] == "one"  # SmolLM2 writes digits one by one
    for task in P.PAIR_TASKS:
        for p in T.generate(task, tok, 20, seed=0):
            P.encode_pair(tok, p)


def test_demo_data_task_cli(tmp_path, lm_dir):
    from attattr_cli.api.demo import PAIR_TASKS

    assert set(PAIR_TASKS) == set(P.PAIR_TASKS)  # the CLI's choices are the registered generators
    out = tmp_path / "gt.jsonl"
    r = run_cli("demo", "data", "--task", "greater-than", "--model", lm_dir, "--count", 5, "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out) and len(P.read_pairs(out)) == 5
    one_error_line(run_cli("demo", "data", "--task", "greater-than", "--model", lm_dir, "--out", out), "exists")
    one_error_line(run_cli("demo", "data", "--task", "facts", "--model", lm_dir, "--out", tmp_path / "x.jsonl"),
                   "unknown --task 'facts'", "capitals")
    one_error_line(run_cli("demo", "data", "--task", "ioi", "--out", tmp_path / "x.jsonl"), "needs a model")
    one_error_line(run_cli("demo", "data", "--task", "ioi", "--model", tmp_path / "nowhere", "--out",
                           tmp_path / "x.jsonl"), "tokenizer")
    syn = tmp_path / "syn.tsv"
    r = run_cli("demo", "data", "--out", syn, "--count", 4)  # the default task is still the synthetic TSV
    assert r.exit_code == 0 and syn.read_text().splitlines()[0].split("\t")[:2] == ["premise", "hypothesis"]


# -- scoring pairs: each with its own answer and foil -------------------------------------------
@pytest.mark.parametrize("metric", ["logit-diff", "logprob-diff", "prob"])
def test_pair_target_equals_slow_reference_of_the_metric(lm_dir, bpe, metric):
    """F of a pair is its metric (checked against a plain forward), and the attribution of a
    pair equals the slow reference of that F (float64), layer by layer."""
    from transformers import AutoModelForCausalLM

    from attattr_cli.engine.integrate import nodes
    from attattr_cli.engine.options import ScoreOptions
    from attattr_cli.engine.scorer import Scorer
    from attattr_cli.models.loading import prepare
    from slow_reference import slow_attribution

    model = AutoModelForCausalLM.from_pretrained(lm_dir, dtype=torch.float64).eval()
    loaded = prepare(model, bpe, "tiny-llama-bpe", lm=True)
    pair = T.generate("greater-than", bpe, 1, seed=2)[0]  # answer and foil are sets of tokens
    ex = P.as_examples([pair])[0]
    result = Scorer(loaded, ScoreOptions(steps=6, dtype="float64", lm=True, metric=metric)).score(ex)
    assert result.f_full == pytest.approx(_direct_metric(model, bpe, pair, metric, torch.float64), rel=1e-9)
    lm = result.meta["lm"]
    assert lm["metric"] == metric and lm["target_tokens"] == [bpe.tokenize(t)[0] for t in pair.answer]
    assert lm["foil_tokens"] == [bpe.tokenize(t)[0] for t in pair.foil] and result.meta["pair"]["foil"] == list(pair.foil)
    enc = bpe(pair.prompt)["input_ids"]
    a, f = lm["target_ids"], lm["foil_ids"]

    def f_of(lg):
        lg = lg[:, -1].double()
        if metric == "logit-diff":
            return lg[:, a].mean(-1) - lg[:, f].mean(-1)
        p = torch.softmax(lg, -1)
        return p[:, a].sum(-1) if metric == "prob" else torch.log(p[:, a].sum(-1)) - torch.log(p[:, f].sum(-1))

    alphas, weights = nodes("right", 6)
    ref, f0 = slow_attribution(model, {"input_ids": torch.tensor([enc])}, result.layers, alphas, weights, None,
                               f_of_logits=f_of, more_inputs={"use_cache": False})
    for k, layer in enumerate(result.layers):
        got, want = torch.as_tensor(np.asarray(result.attribution[k])), ref[layer]
        assert float((got - want).abs().max() / want.abs().max()) < 1e-6
        assert result.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9, abs=1e-12)


def _store_arrays(path):
    import attattr_cli as aa

    st = aa.open_store(path)
    return {i: (np.asarray(st[i].head_max), st[i].f_full, st[i].meta["lm"]["target_ids"], st[i].meta["lm"]["foil_ids"])
            for i in st.indices}


def test_pairs_share_one_store_merge_resume_and_refusals(tmp_path, lm_dir, ioi_file):
    whole, a, b, m = (tmp_path / f"{n}.h5" for n in ("whole", "a", "b", "m"))
    common = ("score", "--lm", "--model", lm_dir, "--data", ioi_file, "--steps", 3, "-q")
    assert run_cli(*common, "--out", whole).exit_code == 0
    assert run_cli(*common, "--out", a, "--examples", "0:3").exit_code == 0
    assert run_cli(*common, "--out", b, "--examples", "3:6").exit_code == 0
    r = run_cli("merge", a, b, "--out", m)
    assert r.exit_code == 0, r.output
    ref, got = _store_arrays(whole), _store_arrays(m)
    assert sorted(got) == list(range(6))
    for i in ref:
        assert np.array_equal(ref[i][0], got[i][0]) and ref[i][1:] == got[i][1:]
    assert len({tuple(v[2]) for v in ref.values()}) > 1  # the pairs have their own answers in one store
    pairs = P.read_pairs(ioi_file)
    model = __import__("transformers").AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    for i, p in enumerate(pairs):
        assert ref[i][1] == pytest.approx(_direct_metric(model, P_tok(lm_dir), p, "logit-diff"), rel=1e-4, abs=1e-5)
    # resume: the store of 0:3 takes the rest
    r = run_cli(*common[:-1], "--out", a)
    assert r.exit_code == 0 and "scored 3 examples (3 already in the store)" in r.stderr
    # a real mismatch is refused: another metric, other pairs
    one_error_line(run_cli(*common, "--out", b, "--metric", "prob"), "other options", "metric")
    edited = tmp_path / "edited.jsonl"
    rows = [json.loads(x) for x in ioi_file.read_text().splitlines()]
    rows[0]["foil"] = rows[1]["answer"] if rows[1]["answer"] != rows[0]["answer"] else rows[2]["answer"]
    edited.write_text("".join(json.dumps(x) + "\n" for x in rows))
    one_error_line(run_cli(*common[:5], edited, *common[6:], "--out", b), "other data")


def P_tok(folder):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def test_pairs_in_memory_save_and_read_back(tmp_path, lm_dir, ioi_file):
    import attattr_cli as aa

    model = aa.load_model(str(lm_dir), lm=True)
    pairs = P.read_pairs(ioi_file)
    res = aa.score(model, pairs, steps=3, metric="logprob-diff")
    assert [e.meta["lm"]["metric"] for e in res] == ["logprob-diff"] * len(pairs)
    out = res.save(tmp_path / "mem.h5")
    st = aa.open_store(out)
    assert st.indices == list(range(len(pairs)))
    assert [st[i].f_full for i in st.indices] == pytest.approx([e.f_full for e in res])
    imp = aa.importance(out)
    assert imp["attr"].shape == (2, 4)


@pytest.mark.parametrize("args, text", [
    (("--metric", "prob"), "--metric goes with clean / counterfactual pairs"),
    (("--metric", "nope"), "unknown --metric"),
    (("--target-token", " Mary"), "does not go with --target-token"),
    (("--logprob",), "does not go with --logit or --logprob"),
])
def test_score_option_refusals_are_one_line(tmp_path, lm_dir, ioi_file, args, text):
    data = ioi_file
    if args[:2] == ("--metric", "prob"):
        data = tmp_path / "p.txt"
        data.write_text("text\nw1 w2\n")
    one_error_line(run_cli("score", "--lm", "--model", lm_dir, "--data", data, "--out", tmp_path / "x.h5", *args), text)
    assert not (tmp_path / "x.h5").exists()


def test_unequal_pair_is_one_line_naming_it(tmp_path, lm_dir):
    f = tmp_path / "uneven.jsonl"
    f.write_text(json.dumps({"prompt": "The capital of France is", "counterfactual": "The capital city of Spain is",
                             "answer": " Paris", "foil": " Madrid"}) + "\n")
    one_error_line(run_cli("score", "--lm", "--model", lm_dir, "--data", f, "--out", tmp_path / "x.h5"),
                   "pair 0", "equal token lengths")


# -- importance and prune on a pooled pair store -----------------------------------------------
@pytest.fixture(scope="module")
def pair_store(tmp_path_factory, lm_dir, ioi_file):
    out = tmp_path_factory.mktemp("pair_store") / "ioi.h5"
    r = run_cli("score", "--lm", "--model", lm_dir, "--data", ioi_file, "--steps", 3, "--out", out, "-q")
    assert r.exit_code == 0, r.output
    return out


def test_importance_of_a_pair_store(tmp_path, pair_store):
    import attattr_cli as aa

    imp = aa.importance(pair_store, methods="attr,attention,random", seeds=[0, 1])
    st = aa.open_store(pair_store)
    examples = [st[i] for i in st.indices]
    assert np.allclose(imp["attr"], np.mean([np.asarray(e.head_max, np.float64) for e in examples], axis=0))
    # a language model's attention baseline reads the rows of the attributed position (the last)
    want = np.mean([np.asarray(e.attention, np.float64)[:, :, -1, :].max(-1) for e in examples], axis=0)
    assert np.allclose(imp["attention"], want) and not np.allclose(imp["attention"], 1.0)
    assert set(imp.tables) == {"attr", "attention", "random-0", "random-1"}


def _masked_metric(model, tok, pair, mask, metric="logit-diff") -> float:
    """The pair's metric with heads zeroed: one example alone through engine.heads.masked."""
    from attattr_cli.engine.heads import masked

    with torch.no_grad(), masked(model, torch.as_tensor(mask, dtype=torch.float32)):
        ids = tok(pair.prompt)["input_ids"]
        logits = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
    a = [tok.convert_tokens_to_ids(tok.tokenize(t))[0] for t in pair.answer]
    f = [tok.convert_tokens_to_ids(tok.tokenize(t))[0] for t in pair.foil]
    if metric == "logit-diff":
        return float(logits[a].mean() - logits[f].mean())
    p = torch.softmax(logits.double(), -1)
    return float(torch.log(p[a].sum()) - torch.log(p[f].sum()))


@pytest.mark.parametrize("metric", ["logit-diff", "logprob-diff"])
def test_prune_curves_of_pairs_equal_a_direct_evaluation(tmp_path, lm_dir, ioi_file, pair_store, metric):
    import attattr_cli as aa
    from attattr_cli.analysis.prune import mask_at
    from transformers import AutoModelForCausalLM

    imp = aa.importance(pair_store, methods="attr,attention,random", seeds=[0, 1], out=tmp_path / "imp.h5")
    rates = [0, 0.25, 0.5, 1]
    out = tmp_path / "curves.json"
    r = run_cli("prune", "--model", lm_dir, "--data", ioi_file, "-i", imp.path, "--rates", "0,0.25,0.5,1",
                "--metric", metric, "--out", out, "--batch-size", 4, "--split", "none")
    assert r.exit_code == 0, r.output
    assert f"{metric} with the least important heads masked" in r.stderr
    doc = json.loads(out.read_text())
    c = doc["curves"]
    assert c["metric"] == metric and doc["metric"] == metric and c["n_examples"] == 6
    model = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    tok = P_tok(lm_dir)
    pairs = P.read_pairs(ioi_file)
    ones = np.ones((2, 4))
    full = np.mean([_masked_metric(model, tok, p, ones, metric) for p in pairs])
    zero = np.mean([_masked_metric(model, tok, p, 0 * ones, metric) for p in pairs])
    assert c["baseline"][metric] == pytest.approx(full, rel=1e-4, abs=1e-5)
    assert c["zeroed"][metric] == pytest.approx(zero, rel=1e-4, abs=1e-5)
    if metric == "logit-diff":  # the unpruned metric is the store's F, the mean over its pairs
        st = aa.open_store(pair_store)
        assert full == pytest.approx(np.mean([st[i].f_full for i in st.indices]), rel=1e-4, abs=1e-5)
    for name in ("attr", "attention"):
        entry = c["methods"][name]
        for j, rate in enumerate(rates):
            mask = mask_at(imp[name], rate).numpy()
            want = np.mean([_masked_metric(model, tok, p, mask, metric) for p in pairs])
            assert entry[metric][j] == pytest.approx(want, rel=1e-4, abs=1e-5)
            assert entry["faithfulness"][j] == pytest.approx((want - zero) / (full - zero), rel=1e-3, abs=1e-4)
            assert entry[f"{metric}_low"][j] <= entry[metric][j] + 1e-9 <= entry[f"{metric}_high"][j] + 2e-9
    rnd = c["methods"]["random"]
    assert rnd["seeds"] == 2 and rnd[metric] == pytest.approx(
        np.mean([rnd["tables"][n][metric] for n in ("random-0", "random-1")], axis=0))
    assert set(c["methods"]["attr"]["tests"]) == {"attention", "random"}
    r = run_cli("prune", "--model", lm_dir, "--data", ioi_file, "-i", imp.path, "--rates", "0,1", "--out",
                tmp_path / "c.json", "--csv", "-q", "--split", "none")
    assert r.exit_code == 0 and "faithfulness" in r.stdout.splitlines()[0]
    assert doc["split"]["same_pairs"] and doc["split"]["eval"] == list(range(6))


def test_prune_on_pairs_draws_its_curves_on_pairs_the_ranking_never_saw(tmp_path, lm_dir, ioi_file):
    """MIB's protocol for prune on pairs: by default the curves use only the pairs no importance
    table was averaged over; a ranking made from every pair is refused in one line."""
    import attattr_cli as aa

    store = tmp_path / "first.h5"
    assert run_cli("score", "--lm", "--model", lm_dir, "--data", ioi_file, "--examples", "0:3", "--steps", 2,
                   "--out", store, "-q").exit_code == 0
    imp = aa.importance(store, methods="attr,attention", out=tmp_path / "imp.h5")
    res = aa.prune(str(lm_dir), imp.path, data=str(ioi_file), rates=[0, 0.5, 1])
    assert res.info["split"]["ranked_on"] == [0, 1, 2] and res.info["split"]["eval"] == [3, 4, 5]
    assert res.curves["n_examples"] == 3
    from attattr_cli.errors import OptionError

    with pytest.raises(OptionError, match="every picked pair was used"):
        aa.prune(str(lm_dir), imp.path, data=str(ioi_file), rates=[0, 1], examples="0:3")
    r = run_cli("prune", "--model", lm_dir, "--data", ioi_file, "-i", imp.path, "--examples", "0:3", "-q",
                "--out", tmp_path / "never.json")
    assert r.exit_code == 2
    one_error_line(r, "every picked pair was used by the importance tables")


def test_taylor_of_pairs_equals_a_direct_gradient(lm_dir, ioi_file):
    import attattr_cli as aa
    from attattr_cli.engine.heads import masked
    from transformers import AutoModelForCausalLM

    imp = aa.importance(model=str(lm_dir), data=str(ioi_file), methods="taylor", normalize=False)
    model = AutoModelForCausalLM.from_pretrained(lm_dir).eval()
    tok = P_tok(lm_dir)
    total = torch.zeros(2, 4, dtype=torch.float64)
    pairs = P.read_pairs(ioi_file)
    for p in pairs:
        gate = torch.ones(2, 4, requires_grad=True)
        with masked(model, gate):
            logits = model(torch.tensor([tok(p.prompt)["input_ids"]]), use_cache=False).logits[0, -1]
            a, f = (tok.convert_tokens_to_ids(tok.tokenize(t[0])) for t in (p.answer, p.foil))
            (g,) = torch.autograd.grad(logits[a].mean() - logits[f].mean(), gate)
        total += g.abs().double()
    assert np.allclose(imp["taylor"], (total / len(pairs)).numpy(), rtol=1e-4, atol=1e-7)


def test_prune_and_importance_pair_refusals_are_one_line(tmp_path, lm_dir, ioi_file, pair_store):
    imp = tmp_path / "imp.h5"
    assert run_cli("importance", pair_store, "--out", imp, "-q").exit_code == 0
    base = ("prune", "--model", lm_dir, "--data", ioi_file, "-i", imp, "--out", tmp_path / "c.json")
    one_error_line(run_cli(*base, "--metric", "nope"), "unknown metric 'nope'")
    one_error_line(run_cli(*base, "--effectiveness", pair_store), "go with classifiers")
    one_error_line(run_cli("prune", "--model", lm_dir, "--data", ioi_file, "--out", tmp_path / "c.json"),
                   "nothing to do")
    assert not (tmp_path / "c.json").exists()


def test_circuit_head_methods_rank_heads_for_importance_and_prune(tmp_path, lm_dir, ioi_file):
    """On pairs, importance takes attattr circuit's head methods (one table each, its mean score
    over the pairs it saw), and prune judges them on the pairs they did not see."""
    import attattr_cli as aa
    from attattr_cli.analysis.circuits import REGISTRY
    from attattr_cli.analysis.circuits.task import CircuitTask, Context
    from attattr_cli.errors import OptionError

    imp = aa.importance(model=str(lm_dir), data=str(ioi_file), examples="0:3", methods="atp,nap-ig,random",
                        seeds=[0], out=tmp_path / "imp.h5")
    assert {"atp", "nap-ig", "random-0"} <= set(imp.tables)
    loaded = aa.load_model(str(lm_dir), lm=True)
    pairs = P.read_pairs(ioi_file)[:3]
    want = REGISTRY["atp"].compute(Context(CircuitTask(loaded.loaded, pairs))).mean(0)
    np.testing.assert_allclose(imp["atp"], want, rtol=1e-5, atol=1e-7)
    assert imp.tables["atp"].examples == [0, 1, 2]
    res = aa.prune(str(lm_dir), imp.path, data=str(ioi_file), rates=[0, 0.5, 1])
    assert {"atp", "nap-ig"} <= set(res.curves["methods"]) and res.info["split"]["eval"] == [3, 4, 5]
    with pytest.raises(OptionError, match="method 'atp' needs clean / counterfactual pairs"):
        aa.importance(methods="atp")
