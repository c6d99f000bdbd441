"""Head masking, importance tables against direct computations, the importance file, finetune."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from attattr_cli.analysis import importance as imp
from attattr_cli.cli import app
from attattr_cli.data import load_examples
from attattr_cli.engine.heads import Batches, logits_under, masked
from attattr_cli.errors import OptionError, StoreError
from attattr_cli.models.arch import find_layers
from conftest import one_error_line

runner = CliRunner()

# where each family's output projection lives inside one layer (its input is the per-head context)
OUT_PROJ = {
    "bert": lambda layer: layer.attention.output.dense,
    "roberta": lambda layer: layer.attention.output.dense,
    "distilbert": lambda layer: layer.attention.out_lin,
    "gpt2": lambda layer: layer.attn.c_proj,
    "llama": lambda layer: layer.self_attn.o_proj,
}


def _inputs(loaded, n=3):
    torch.manual_seed(1)
    ids = torch.randint(5, 45, (n, 9))
    ids[:, 0] = 2
    return {"input_ids": ids}


@pytest.mark.parametrize("kind", list(OUT_PROJ))
def test_masking_a_head_equals_zeroing_its_output(loaded_factory, kind):
    loaded = loaded_factory(kind)
    model = loaded.model
    L, H = loaded.arch.num_layers, loaded.arch.num_heads
    _, layers = find_layers(model)
    proj = OUT_PROJ[kind](layers[0])
    d = (proj.in_features if hasattr(proj, "in_features") else proj.weight.shape[0]) // H
    mask = torch.ones(L, H)
    mask[0, 1] = 0
    mask[1, 3] = 0
    mask[2, 0] = mask[2, 2] = 0
    inputs = _inputs(loaded)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = 0  # decoders refuse batches without one; 0 is not in the inputs

    def zero_heads(i):
        def pre(module, args):
            x = args[0].clone()
            for h in range(H):
                if mask[i, h] == 0:
                    x[..., h * d:(h + 1) * d] = 0
            return (x, *args[1:])
        return pre

    hooks = [OUT_PROJ[kind](layer).register_forward_pre_hook(zero_heads(i)) for i, layer in enumerate(layers)]
    try:
        with torch.no_grad():
            by_hand = model(**inputs).logits
    finally:
        for h in hooks:
            h.remove()
    with torch.no_grad(), masked(model, mask):
        ours = model(**inputs).logits
    with torch.no_grad():
        unmasked = model(**inputs).logits
    torch.testing.assert_close(ours, by_hand, atol=1e-5, rtol=1e-5)
    assert (ours - unmasked).abs().max() > 1e-4  # the mask did something
    # a mask of ones is the unmasked model; the implementation is restored after the block
    with torch.no_grad(), masked(model, torch.ones(L, H)):
        torch.testing.assert_close(model(**inputs).logits, unmasked, atol=1e-5, rtol=1e-5)
    assert model.config._attn_implementation != "attattr"


def test_per_example_masks_equal_one_mask_each(loaded_factory):
    loaded = loaded_factory("bert")
    model = loaded.model
    inputs = _inputs(loaded, 2)
    m = torch.ones(2, 3, 4)
    m[0, 0, 0] = 0
    m[1, 2, 3] = 0
    with torch.no_grad(), masked(model, m):
        both = model(**inputs).logits
    for i in range(2):
        with torch.no_grad(), masked(model, m[i]):
            one = model(**{k: v[i:i + 1] for k, v in inputs.items()}).logits
        torch.testing.assert_close(both[i:i + 1], one, atol=1e-5, rtol=1e-5)


def _sst2(tiny_model_dir, sst2_small):
    from attattr_cli.models.loading import align_labels, load

    loaded = load(str(tiny_model_dir), device="cpu")
    from attattr_cli.data import get_task

    examples, labels = load_examples(str(sst2_small), get_task("sst2"))
    return loaded, examples, align_labels(labels, loaded)[0]


def test_padded_batches_give_the_logits_of_single_examples(tiny_model_dir, sst2_small):
    loaded, examples, label_map = _sst2(tiny_model_dir, sst2_small)
    mask = torch.ones(3, 4)
    mask[1, 2] = 0
    batched = logits_under(loaded, Batches(loaded, examples, label_map, batch_size=8), mask)
    single = logits_under(loaded, Batches(loaded, examples, label_map, batch_size=1), mask)
    torch.testing.assert_close(batched, single, atol=1e-5, rtol=1e-5)


def test_taylor_equals_a_direct_computation(tiny_model_dir, sst2_small):
    loaded, examples, label_map = _sst2(tiny_model_dir, sst2_small)
    model = loaded.model
    _, layers = find_layers(model)
    L, H = 3, 4
    d = model.config.hidden_size // H
    table = imp.taylor(loaded, examples, label_map, batch_size=3, normalize=False)
    # by hand: per example, capture each layer's context (input of the output projection)
    direct = torch.zeros(L, H, dtype=torch.float64)
    tok = loaded.tokenizer
    for e in examples:
        ctx = {}

        def keep(i):
            def pre(module, args):
                x = args[0]
                x.retain_grad()
                ctx[i] = x
            return pre

        hooks = [layer.attention.output.dense.register_forward_pre_hook(keep(i)) for i, layer in enumerate(layers)]
        try:
            with torch.enable_grad():
                enc = tok(e.text_a, return_tensors="pt")
                emb_hook = model.bert.embeddings.register_forward_hook(lambda m, a, o: o.requires_grad_(True))
                logits = model(**enc).logits
                emb_hook.remove()
                loss = torch.nn.functional.cross_entropy(logits, torch.tensor([label_map[e.label]]))
                loss.backward()
        finally:
            for h in hooks:
                h.remove()
        for i in range(L):
            prod = (ctx[i] * ctx[i].grad)[0].view(-1, H, d).sum((0, 2))
            direct[i] += prod.detach().abs().double()
    direct /= len(examples)
    np.testing.assert_allclose(table.values, direct.numpy(), rtol=1e-4, atol=1e-7)
    normed = imp.taylor(loaded, examples, label_map, batch_size=8).values
    np.testing.assert_allclose(np.linalg.norm(normed, axis=1), 1.0, rtol=1e-6)
    assert table.examples == [e.index for e in examples]


@pytest.fixture(scope="module")
def tiny_store(tmp_path_factory, tiny_model_dir):
    from attattr_cli.engine.run import ScoreRequest, score_to_store
    from attattr_cli.engine.options import ScoreOptions

    d = tmp_path_factory.mktemp("store")
    data = d / "small.tsv"
    from conftest import WORDS

    rows = ["sentence\tlabel"] + [f"{' '.join(WORDS[i:i + 4 + i % 3])}\t{i % 2}" for i in range(8)]
    data.write_text("\n".join(rows) + "\n")
    out = d / "s.h5"
    score_to_store(ScoreRequest(out=str(out), model=str(tiny_model_dir), data=str(data), task="sst2",
                                examples="0:5", options=ScoreOptions(steps=4), device="cpu"))
    return out, data


def test_store_tables_equal_a_direct_computation(tiny_store):
    from attattr_cli.store import Store

    path, _ = tiny_store
    with Store(path) as st:
        ident, tables = imp.from_store(st, ["attr", "attention"])
        by = {t.name: t for t in tables}
        attr = np.mean([st.get(i).attribution.reshape(3, 4, -1).max(-1) for i in st.indices()], axis=0)
        attn = np.mean([st.get(i).attention.reshape(3, 4, -1).max(-1) for i in st.indices()], axis=0)
        assert by["attr"].examples == st.indices() == [0, 1, 2, 3, 4]
        _, sub = imp.from_store(st, ["attr"], [1, 3])
        np.testing.assert_allclose(sub[0].values, np.mean([st.get(i).head_max for i in (1, 3)], axis=0))
    np.testing.assert_allclose(by["attr"].values, attr, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(by["attention"].values, attn, rtol=1e-6)
    assert (ident.num_layers, ident.num_heads) == (3, 4)
    assert by["attr"].values.min() != by["attr"].values.max()


def test_ranking_stability_from_the_store(tmp_path, tiny_store):
    from attattr_cli.analysis import stats
    from attattr_cli.store import Store

    path, _ = tiny_store
    with Store(path) as st:
        _, tables = imp.from_store(st, ["attr"])
        each = np.stack([st.get(i).head_max for i in st.indices()]).astype(np.float64)
    s = tables[0].stability
    assert s["examples"] == 5 and s["rank_low"].shape == (3, 4)
    lo, hi = stats.rank_intervals(each.reshape(5, -1), resamples=1000, seed=0)
    np.testing.assert_array_equal(s["rank_low"].ravel(), lo)
    np.testing.assert_array_equal(s["rank_high"].ravel(), hi)
    assert np.all((1 <= s["rank_low"]) & (s["rank_low"] <= s["rank_high"]) & (s["rank_high"] <= 12))
    assert s["tau_halves"] == pytest.approx(stats.kendall_tau_halves(each.reshape(5, -1), seed=0))
    assert -1 <= s["tau_halves"] <= 1
    # seeded: the same again; kept in the file
    again = imp.stability(each, seed=0)
    np.testing.assert_array_equal(again["rank_low"], s["rank_low"])
    out = tmp_path / "imp.h5"
    imp.write(out, imp.Identity("a" * 64, "m", "bert", 3, 4), tables)
    back = imp.read(out).tables["attr"].stability
    np.testing.assert_array_equal(back["rank_high"], s["rank_high"])
    assert back["tau_halves"] == pytest.approx(s["tau_halves"])
    r = runner.invoke(app, ["importance", str(path), "--out", str(tmp_path / "i2.h5"), "--json"])
    assert r.exit_code == 0, r.output
    rows = json.loads(r.stdout)
    assert all(row["rank_low"] <= row["rank_high"] for row in rows)


def test_importance_file_roundtrip_and_refusals(tmp_path, tiny_store):
    from attattr_cli.store import Store

    path, _ = tiny_store
    with Store(path) as st:
        ident, tables = imp.from_store(st, ["attr"])
    out = tmp_path / "imp.h5"
    imp.write(out, ident, tables + [imp.random_table(3, 4, 0), imp.random_table(3, 4, 1)])
    back = imp.read(out)
    assert list(back.tables) == ["attr", "random-0", "random-1"] or set(back.tables) == {"attr", "random-0", "random-1"}
    np.testing.assert_array_equal(back.tables["attr"].values, tables[0].values)
    assert back.tables["attr"].examples == [0, 1, 2, 3, 4]
    assert [len(g) for g in back.groups().values()] == [1, 2] or sorted(len(g) for g in back.groups().values()) == [1, 2]
    # same seed, same table; other seed, other table
    np.testing.assert_array_equal(imp.random_table(3, 4, 0).values, back.tables["random-0"].values)
    assert not np.array_equal(back.tables["random-0"].values, back.tables["random-1"].values)
    before = out.read_bytes()
    other = imp.Identity("0" * 64, "other", "bert", 3, 4)
    with pytest.raises(StoreError, match="another model"):
        imp.write(out, other, [imp.random_table(3, 4, 5)])
    assert out.read_bytes() == before
    with pytest.raises(StoreError, match="shape"):
        imp.write(tmp_path / "x.h5", ident, [imp.random_table(2, 4, 0)])
    with pytest.raises(StoreError, match="not an attattr importance file"):
        imp.read(path)  # a store is not an importance file
    with pytest.raises(OptionError, match="unknown importance method"):
        imp.parse_methods("attr,bogus", "store")
    with pytest.raises(OptionError, match="needs a store"):
        imp.parse_methods("attr", "data")


def test_importance_cli_store_and_model(tmp_path, tiny_store, tiny_model_dir):
    path, data = tiny_store
    out = tmp_path / "imp.h5"
    r = runner.invoke(app, ["importance", str(path), "--out", str(out), "--plot", str(tmp_path / "h.svg")])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out)
    assert "attr:" in r.stderr and "L\\H" in r.stderr
    assert "attr ranking over 5 examples: Kendall tau between two random halves" in r.stderr
    assert (tmp_path / "h.svg").read_text().lstrip().startswith("<?xml")
    r = runner.invoke(app, ["importance", "--model", str(tiny_model_dir), "--data", str(data), "--task", "sst2",
                            "--method", "taylor,random", "--seeds", "0,1,2", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert set(imp.read(out).tables) == {"attr", "attention", "taylor", "random-0", "random-1", "random-2"}
    r = runner.invoke(app, ["importance", "--method", "taylor", "--out", str(out), "-q"])  # built-in model: another one
    one_error_line(r, "another model")
    assert set(imp.read(out).tables) == {"attr", "attention", "taylor", "random-0", "random-1", "random-2"}


def test_finetune_builtin_default_and_refusals(tmp_path):
    out = tmp_path / "ft"
    r = runner.invoke(app, ["finetune", "--out", str(out), "--epochs", "0.1", "--seed", "1"])
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out)
    assert "eval accuracy" in r.stderr
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert model.config.id2label[0] == "entailment"
    assert (out / "FINETUNE.json").exists() and not list(tmp_path.glob(".ft.tmp-*"))
    r = runner.invoke(app, ["finetune", "--out", str(out), "--epochs", "0.1", "-q"])
    one_error_line(r, "not empty")
    one_error_line(runner.invoke(app, ["finetune", "--out", str(tmp_path / "x"), "--data", "nope.tsv", "--model", str(out)]))


def test_finetune_bare_encoder_gets_a_new_head(tmp_path, tokenizer, sst2_small):
    from transformers import AutoModelForSequenceClassification, BertConfig, BertModel

    base = tmp_path / "enc"
    torch.manual_seed(0)
    BertModel(BertConfig(vocab_size=45, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=37, max_position_embeddings=48)).save_pretrained(base)
    tokenizer.save_pretrained(base)
    out = tmp_path / "clf"
    r = runner.invoke(app, ["finetune", "--model", str(base), "--data", str(sst2_small), "--task", "sst2",
                            "--eval-data", str(sst2_small), "--epochs", "2", "--batch-size", "4",
                            "--freeze-embeddings", "--out", str(out), "-q"])
    assert r.exit_code == 0, r.output
    assert "LOAD REPORT" not in r.output
    model = AutoModelForSequenceClassification.from_pretrained(str(out))
    assert model.config.id2label == {0: "negative", 1: "positive"}
    enc = AutoModelForSequenceClassification.from_pretrained(str(base), num_labels=2)
    # frozen embeddings are unchanged, the encoder moved
    torch.testing.assert_close(model.bert.embeddings.word_embeddings.weight, enc.bert.embeddings.word_embeddings.weight)
    assert not torch.allclose(model.bert.encoder.layer[0].attention.self.query.weight,
                              enc.bert.encoder.layer[0].attention.self.query.weight)
