"""Beyond encoders: BART attention families, decoder LMs (GPT-2, Llama with rotary positions
and grouped-query attention) as language models, long-input storage (--keep, --top-k),
step micro-batching, and the store's families. Each fast path is checked against the slow,
paper-exact reference of tests/slow_reference.py."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine import memory as memory_mod, options as options_mod
from attattr_cli.engine.integrate import nodes
from attattr_cli.engine.scorer import Scorer
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.errors import DataError, OptionError
from attattr_cli.models.loading import prepare
from attattr_cli.store import SCHEMA_VERSION, Store
from conftest import build_model, one_error_line, run_cli, with_sentiment_labels
from slow_reference import slow_attribution

PAIR = Example(0, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1)
PROMPT = Example(0, "w1 w2 w3 w4 w5 w6")


def build(kind: str, dtype=torch.float64, layers: int = 2):
    """conftest's tiny models: BART as a two-class classifier, GPT-2 and Llama (rotary
    positions, 4 query heads sharing 2 key/value heads) as causal LMs."""
    model = build_model(kind, dtype, num_labels=2, layers=layers, lm=kind != "bart")
    return with_sentiment_labels(model) if kind == "bart" else model


@pytest.fixture
def make(tokenizer):
    def _make(kind, dtype=torch.float64, layers=2):
        return prepare(build(kind, dtype, layers), tokenizer, f"tiny-{kind}", lm=kind != "bart")

    return _make


def _rel(a, b):
    return float((a - b).abs().max() / b.abs().max())


def _lm_reference(scorer, result, example, steps=8):
    enc = scorer.encode(example)
    tgt = torch.tensor(result.meta["lm"]["target_ids"])
    output = scorer.options.output

    def f_of_logits(lg):
        logp = torch.log_softmax(lg, -1).gather(-1, tgt.view(1, -1, 1).expand(lg.shape[0], -1, 1)).squeeze(-1).sum(-1)
        return logp if output == "logprob" else logp.exp()

    alphas, weights = nodes("right", steps)
    return slow_attribution(scorer.model, {"input_ids": torch.tensor([enc.input_ids])}, result.layers, alphas,
                            weights, None, f_of_logits=f_of_logits,
                            more_inputs={"use_cache": False, "logits_to_keep": torch.tensor(enc.lm_positions)})


# -- BART: three attention families --------------------------------------------------
def test_bart_families_equal_slow_reference(make):
    loaded = make("bart")
    assert loaded.arch.family_names == ["encoder", "decoder", "cross"]
    scorer = Scorer(loaded, ScoreOptions(steps=8, dtype="float64"))
    result = scorer.score(PAIR)
    enc = scorer.encode(PAIR)
    assert list(result.families) == ["encoder", "decoder", "cross"]
    assert result.decoder_tokens[0] == "[SEP]" and result.decoder_tokens[1:] == result.tokens[:-1]
    alphas, weights = nodes("right", 8)
    for name, fs in result.families.items():
        ref, f0 = slow_attribution(loaded.model, {"input_ids": torch.tensor([enc.input_ids])}, fs.layers, alphas,
                                   weights, result.target, family=name, more_inputs={"use_cache": False})
        n = len(enc.input_ids)
        assert fs.attribution.shape == (2, 4, n, n)
        for k, layer in enumerate(fs.layers):
            assert _rel(torch.from_numpy(fs.attribution[k]), ref[layer]) < 1e-6, (name, layer)
            assert fs.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)
    # causal decoder self-attention: nothing above the diagonal
    upper = np.triu(np.ones((len(enc.input_ids),) * 2, dtype=bool), 1)
    assert (result.families["decoder"].attribution[:, :, upper] == 0).all()
    assert (result.families["cross"].attribution[:, :, upper] != 0).any()


def test_bart_family_choice_and_completeness(make):
    loaded = make("bart")
    only = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", family=["cross"], layers=[1])).score(PAIR)
    full = Scorer(loaded, ScoreOptions(steps=4, dtype="float64")).score(PAIR)
    assert list(only.families) == ["cross"]
    assert abs(only.families["cross"].attribution - full.families["cross"].attribution[[1]]).max() < 1e-12
    resid = [abs(Scorer(loaded, ScoreOptions(steps=m, dtype="float64", family=["cross"], output="logit"))
                 .score(PAIR).families["cross"].residual).max() for m in (2, 8, 32)]
    assert resid[0] > resid[1] > resid[2] and resid[2] < 0.2 * resid[0]
    with pytest.raises(OptionError, match="unknown attention family 'self' for this bart model; it has: encoder"):
        Scorer(loaded, ScoreOptions(family=["self"]))


# -- decoder LMs ------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
@pytest.mark.parametrize("opts", [
    {},
    {"target_token": "w5", "position": -2, "output": "logprob"},
    {"continuation": "w7 w8 w9", "output": "logprob"},
    {"continuation": "w7 w8"},
])
def test_lm_targets_equal_slow_reference(make, kind, opts):
    scorer = Scorer(make(kind), ScoreOptions(steps=8, dtype="float64", lm=True, **opts))
    result = scorer.score(PROMPT)
    ref, f0 = _lm_reference(scorer, result, PROMPT)
    lm = result.meta["lm"]
    if "continuation" in opts:
        assert lm["target_tokens"] == opts["continuation"].split()
        assert result.tokens[-len(lm["target_tokens"]) + 1:] == lm["target_tokens"][:-1]
    elif "target_token" in opts:
        assert lm["target_tokens"] == ["w5"] and lm["positions"] == [len(result.tokens) - 2]
    else:
        assert lm["target_ids"] == [lm["predicted_id"]] == [result.pred]
    for k, layer in enumerate(result.layers):
        assert _rel(torch.from_numpy(result.attribution[k]), ref[layer]) < 1e-6, (kind, layer)
        assert result.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)
    upper = np.triu(np.ones((len(result.tokens),) * 2, dtype=bool), 1)
    assert (result.attribution[:, :, upper] == 0).all()  # causal mask respected


def test_llama_lm_completeness_float32_and_gqa(make):
    loaded = make("llama", torch.float32)
    assert loaded.model.config.num_key_value_heads < loaded.model.config.num_attention_heads
    resid = [abs(Scorer(loaded, ScoreOptions(steps=m, lm=True, output="logprob", rule="right"))
                 .score(PROMPT).residual).max() for m in (2, 8, 32)]
    assert resid[0] > resid[1] > resid[2] and resid[2] < 0.2 * resid[0]


def test_lm_option_errors(make):
    loaded = make("gpt2")
    with pytest.raises(OptionError, match=r"--target-token 'w1 w2' is 2 tokens for this tokenizer \(w1 w2\)"):
        Scorer(loaded, ScoreOptions(lm=True, target_token="w1 w2"))
    with pytest.raises(OptionError, match="--target-token, --continuation and --position need --lm"):
        ScoreOptions(target_token="w1").validate(2)
    with pytest.raises(OptionError, match="this model was loaded as a language model: score it with --lm"):
        Scorer(loaded, ScoreOptions())
    with pytest.raises(OptionError, match="--position 9 is outside the prompt of example 0"):
        Scorer(loaded, ScoreOptions(lm=True, position=9)).encode(PROMPT)
    with pytest.raises(DataError, match="example 4 has 62 tokens; the model takes at most 48$"):
        Scorer(loaded, ScoreOptions(lm=True)).encode(Example(4, " ".join(["w1"] * 60)))


# -- long inputs: keep, top-k, micro-batching -------------------------------------------
def test_keep_sum_none_and_top_k_agree_with_maps(make):
    loaded = make("llama")
    maps = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", lm=True, keep="maps")).score(PROMPT)
    summed = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", lm=True, keep="sum", top_k=5)).score(PROMPT)
    none = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", lm=True, keep="none", top_k=3)).score(PROMPT)
    fm, fs, fn = maps.families["self"], summed.families["self"], none.families["self"]
    assert fs.attribution is None and fn.attribution is None and fn.head_sum is None
    assert np.abs(fs.head_sum - fm.attribution.sum(1)).max() < 1e-12
    assert np.abs(fn.head_max - fm.head_max).max() < 1e-12
    assert np.abs(fs.residual - fm.residual).max() < 1e-12
    assert fs.attention.shape == (2, len(maps.tokens), len(maps.tokens))  # head mean of the probabilities
    assert fn.attention is None
    assert fs.topk_index.shape == (2, 4, 5, 2) and fs.topk_value.shape == (2, 4, 5)
    for layer in range(2):
        for h in range(4):
            m = fm.attribution[layer, h]
            want = np.sort(np.abs(m).ravel())[::-1][:5]
            assert np.allclose(np.abs(fs.topk_value[layer, h]), want)
            q, k = fs.topk_index[layer, h].T
            assert np.allclose(m[q, k], fs.topk_value[layer, h])


def test_keep_auto_switches_to_sum_above_the_limit(make, monkeypatch):
    loaded = make("gpt2")
    assert Scorer(loaded, ScoreOptions(steps=2, lm=True)).score(PROMPT).families["self"].keep == "maps"
    monkeypatch.setattr(options_mod, "AUTO_MAPS_UP_TO", 4)
    fs = Scorer(loaded, ScoreOptions(steps=2, lm=True)).score(PROMPT).families["self"]
    assert fs.keep == "sum" and fs.attribution is None and fs.head_sum is not None


def test_auto_micro_batching_and_oom_back_off(make, monkeypatch):
    loaded = make("llama")
    whole = Scorer(loaded, ScoreOptions(steps=8, dtype="float64", lm=True, step_batch=8)).score(PROMPT)
    monkeypatch.setattr(memory_mod, "free_memory", lambda device: 1)  # nothing fits: one step per pass
    small = Scorer(loaded, ScoreOptions(steps=8, dtype="float64", lm=True))
    tiny = small.score(PROMPT)
    assert tiny.step_batch == 1
    assert np.abs(tiny.attribution - whole.attribution).max() < 1e-12
    monkeypatch.setattr(memory_mod, "free_memory", lambda device: 1 << 40)
    scorer = Scorer(loaded, ScoreOptions(steps=8, dtype="float64", lm=True))
    assert scorer.auto_step_batch(scorer.encode(PROMPT), ("self", 0)) == 8  # all steps fit
    monkeypatch.setattr(memory_mod, "CPU_TOKENS_PER_PASS", 16)  # 8 tokens: 2 steps per pass on CPU
    monkeypatch.setattr(memory_mod, "CPU_REFERENCE_HIDDEN", loaded.model.config.hidden_size)
    assert scorer.auto_step_batch(scorer.encode(PROMPT), ("self", 0)) == 2
    monkeypatch.setattr(memory_mod, "CPU_REFERENCE_HIDDEN", loaded.model.config.hidden_size // 2)
    assert scorer.auto_step_batch(scorer.encode(PROMPT), ("self", 0)) == 1  # twice as wide: half the tokens
    monkeypatch.setattr(memory_mod, "CPU_TOKENS_PER_PASS", 2048)
    forward = loaded.model.forward

    def flaky(*args, **kwargs):  # out of memory whenever more than 2 steps run at once
        if kwargs["input_ids"].shape[0] > 2:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(loaded.model, "forward", flaky)
    backed = scorer.score(PROMPT)
    assert backed.step_batch == 2
    assert np.abs(backed.attribution - whole.attribution).max() < 1e-12


# -- the store and the commands ------------------------------------------------------------
def _saved(kind, tmp_path, tokenizer):
    d = tmp_path / kind
    build(kind, torch.float32).save_pretrained(d)
    tokenizer.save_pretrained(d)
    return d


@pytest.fixture
def bart_dir(tmp_path, tokenizer):
    return _saved("bart", tmp_path, tokenizer)


@pytest.fixture
def gpt2_dir(tmp_path, tokenizer):
    return _saved("gpt2", tmp_path, tokenizer)


def test_bart_store_families_info_and_tree(bart_dir, sst2_small, tmp_path):
    out = tmp_path / "bart.h5"
    r = run_cli("score", "--model", bart_dir, "--data", sst2_small, "--examples", "0:2", "--steps", "4", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    with Store(out) as s:
        assert s.schema_version == SCHEMA_VERSION
        assert s.families() == ["encoder", "decoder", "cross"]
        enc, cross = s.get(0), s.get(0, family="cross")
        assert enc.family == "encoder" and enc.attribution.shape[:2] == (2, 4)
        assert cross.tokens == cross.decoder_tokens and cross.key_tokens == enc.tokens
        assert s.provenance["families"]["cross"]["key"] == "input"
        fams = s.summary()["families"]
        assert set(fams) == {"encoder", "decoder", "cross"} and fams["cross"]["keep"] == "maps"
        with pytest.raises(Exception, match="has no attention family 'self'; it has: encoder, decoder, cross"):
            s.get(0, family="self")
    info = run_cli("info", out)
    assert info.exit_code == 0 and "families" in info.output and "cross:" in info.output
    from attattr_cli.cli.info import _families

    assert "cross: 2 layers scored x 4 heads (decoder->input), keep maps" in _families(fams)
    as_json = json.loads(run_cli("info", out, "--json").stdout)
    assert as_json["families"]["decoder"]["query"] == "decoder" and as_json["families"]["encoder"]["heads"] == 4
    refused = run_cli("tree", out, "--example", "0", "--family", "cross")
    assert one_error_line(refused) == ("Error: the attribution tree links tokens of one sequence; the cross family"
                                      " (decoder queries, encoder keys) has none: give --family encoder or decoder")
    tree = run_cli("tree", out, "--example", "0", "--family", "decoder", "--format", "json", "--quiet")
    assert tree.exit_code == 0, tree.output
    with Store(out) as s:
        assert json.loads(tree.stdout)["tokens"] == s.get(0, family="decoder").decoder_tokens


def test_lm_cli_keep_sum_top_k_and_tree(gpt2_dir, tmp_path):
    out = tmp_path / "lm.h5"
    r = run_cli("score", "--lm", "--model", gpt2_dir, "--prompt", "w1 w2 w3 w4", "--prompt", "w5 w6 w7",
                "--target-token", "w9", "--logprob", "--keep", "sum", "--top-k", "3", "--steps", "4", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    with Store(out) as s:
        e = s.get(1)
        assert e.tokens == ["[CLS]", "w5", "w6", "w7", "[SEP]"] and e.meta["lm"]["target_tokens"] == ["w9"]
        assert e.attribution is None and e.head_sum.shape == (2, 5, 5) and e.topk_value.shape == (2, 4, 3)
        assert s.provenance["lm"] is True
    with h5py.File(out) as f:
        assert "attribution" not in f["examples/00000001"] and "head_sum" in f["examples/00000001"]
    tree = run_cli("tree", out, "--example", "1", "--format", "json", "--quiet")
    assert tree.exit_code == 0, tree.output
    # the 1.0 layout is kept for family self with maps
    out2 = tmp_path / "lm2.h5"
    assert run_cli("score", "--lm", "--model", gpt2_dir, "--prompt", "w1 w2", "--steps", "2", "--quiet", "--out", out2).exit_code == 0
    with h5py.File(out2) as f:
        g = f["examples/00000000"]
        assert {"attribution", "attention", "head_max", "layers", "residual"} <= set(g) and "families" not in g


def test_lm_cli_errors_leave_nothing(gpt2_dir, tmp_path):
    out = tmp_path / "x.h5"
    long = " ".join(["w1"] * 60)
    r = run_cli("score", "--lm", "--model", gpt2_dir, "--prompt", long, "--out", out)
    assert one_error_line(r) == "Error: example 0 has 62 tokens; the model takes at most 48"
    assert not out.exists()
    r = run_cli("score", "--lm", "--prompt", "w1", "--out", out)
    assert one_error_line(r).startswith("Error: --lm needs --model")
    r = run_cli("score", "--model", gpt2_dir, "--prompt", "w1", "--out", out)
    assert one_error_line(r) == "Error: --prompt goes with --lm (a causal language model)"
    r = run_cli("score", "--lm", "--model", gpt2_dir, "--prompt", "w1", "--target-token", "w1 w2", "--out", out)
    assert one_error_line(r).startswith("Error: --target-token 'w1 w2' is 2 tokens")
    assert not out.exists()


def test_lm_prompts_from_data_file(gpt2_dir, tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"text": "w1 w2 w3"}\n{"text": "w4 w5"}\n{"text": "w6 w7 w8 w9"}\n')
    out = tmp_path / "d.h5"
    r = run_cli("score", "--lm", "--model", gpt2_dir, "--data", data, "--examples", "1:3", "--continuation", "w9 w10",
                "--steps", "2", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    with Store(out) as s:
        assert s.indices() == [1, 2]
        e = s.get(2)
        assert e.text_a == "w6 w7 w8 w9" and e.tokens == ["[CLS]", "w6", "w7", "w8", "w9", "[SEP]", "w9"]
        assert e.meta["lm"]["positions"] == [5, 6] and e.logits.shape == (2,)


def test_a_1_0_store_still_reads(gpt2_dir, tmp_path, tiny_model_dir, sst2_small):
    """Examples written before schema 1.1 (no families attribute) read as family self."""
    out = tmp_path / "old.h5"
    assert run_cli("score", "--model", tiny_model_dir, "--data", sst2_small, "--examples", "0:2", "--steps", "2",
                   "--quiet", "--out", out).exit_code == 0
    with h5py.File(out, "r+") as f:
        f.attrs["schema_version"] = "1.0"
        for name in f["examples"]:
            del f["examples"][name].attrs["families"]
            del f["examples"][name].attrs["step_batch"]
    with Store(out) as s:
        assert s.families() == ["self"]
        e = s.get(1)
        assert e.family == "self" and e.keep == "maps" and e.attribution.shape[:2] == (3, 4)
        assert np.allclose(e.summed(), e.attribution.sum(1))
        assert s.summary()["families"]["self"]["heads"] == 4
    assert run_cli("tree", out, "--example", "1", "--format", "json", "--quiet").exit_code == 0


def test_bart_no_hook_or_patch_survives_an_exception(make):
    from attattr_cli.engine import attention
    from attattr_cli.models.arch import find_encoder, find_families

    loaded = make("bart")
    model = loaded.model
    before = model.config._attn_implementation
    scorer = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", family=["cross"]))
    decoder_layers = find_families(model)[1][3]
    calls = {"n": 0}

    def boom(module, args, output):
        calls["n"] += 1
        if calls["n"] == 2:  # inside the first integration pass
            raise RuntimeError("boom")

    handle = decoder_layers[1].register_forward_hook(boom)
    try:
        with pytest.raises(RuntimeError, match="boom"):
            scorer.score(PAIR)
    finally:
        handle.remove()
    assert model.config._attn_implementation == before
    modules = [find_encoder(model), *[layer for _n, _p, _a, ls in find_families(model) for layer in ls]]
    assert all(not m._forward_hooks for m in modules)
    assert all("forward" not in vars(m) for m in model.modules())
    assert attention._plan.get() is None and attention._owner.get() is None
    again = scorer.score(PAIR)
    assert again.families["cross"].attribution.shape[0] == 2


def test_importance_and_prune_take_a_family_and_refuse_the_rest(bart_dir, gpt2_dir, sst2_small, tmp_path):
    from attattr_cli.analysis import importance as imp

    out = tmp_path / "bart.h5"
    assert run_cli("score", "--model", bart_dir, "--data", sst2_small, "--examples", "0:2", "--steps", "4", "--quiet",
                   "--out", out).exit_code == 0
    r = run_cli("importance", out, "--family", "encoder", "--method", "attr,attention", "--out", tmp_path / "imp.h5", "-q")
    assert r.exit_code == 0, r.output
    got = imp.read(tmp_path / "imp.h5").tables["attr"].values
    with Store(out) as s:
        direct = np.mean([s.get(i, family="encoder").head_max for i in (0, 1)], axis=0)
    assert got.shape == (2, 4) and np.allclose(got, direct)
    for fam in ("decoder", "cross"):
        r = run_cli("importance", out, "--family", fam, "--out", tmp_path / f"{fam}.h5", "-q")
        assert not (tmp_path / f"{fam}.h5").exists()
        assert one_error_line(r) == (f"Error: head importance and pruning work on self-attention and encoder heads; the {fam}"
                                    " family of an encoder-decoder model is not supported (use --family encoder)")
    r = run_cli("importance", out, "--family", "self", "--out", tmp_path / "x.h5", "-q")
    assert one_error_line(r).endswith("has no attention family 'self'; it has: encoder, decoder, cross")
    lm = tmp_path / "lm.h5"
    assert run_cli("score", "--lm", "--model", gpt2_dir, "--prompt", "w1 w2 w3", "--keep", "sum", "--steps", "2", "--quiet",
                   "--out", lm).exit_code == 0
    r = run_cli("importance", lm, "--method", "attention", "--out", tmp_path / "lm_imp.h5", "-q")
    assert r.exit_code != 0 and "keeps no per-head attention maps" in r.stderr
    r = run_cli("importance", lm, "--method", "attr", "--out", tmp_path / "lm_imp.h5", "-q")
    assert r.exit_code == 0, r.output
    assert imp.read(tmp_path / "lm_imp.h5").tables["attr"].values.shape == (2, 4)
