"""Several short examples per pass (engine/grouped.py) and the first-token last layer:
the same numbers as one example at a time, every example scored once, bad cases refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine import attention, grouped
from attattr_cli.engine.encoding import encode
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.scorer import Scorer
from attattr_cli.store import Store

from slow_reference import slow_attribution

# pairs and single sentences of different lengths: every group is padded
EXAMPLES = [Example(0, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1), Example(1, "w2", None, label=0),
            Example(2, "w9 w3 w1 w4 w4 w2 w7 w8 w5 w6", "w1", label=2), Example(3, "w5 w6", "w7 w8 w9", label=0),
            Example(4, "w3 w3 w3", None, label=1)]


def _both(scorer: Scorer):
    encs = [scorer.encode(e) for e in EXAMPLES]
    one = [scorer.score(e, c) for e, c in zip(EXAMPLES, encs)]
    together = grouped.score_group(scorer, EXAMPLES, encs)
    return one, together


def _assert_same(one, together, rtol=1e-5):
    for a, b in zip(one, together):
        assert a.index == b.index and a.tokens == b.tokens
        assert (a.pred, a.target, a.gold) == (b.pred, b.target, b.gold)
        scale = np.abs(a.attribution).max()
        assert np.abs(a.attribution - b.attribution).max() <= rtol * scale, a.index
        np.testing.assert_allclose(b.attention, a.attention, atol=1e-6)
        np.testing.assert_allclose(b.logits, a.logits, atol=1e-5)
        np.testing.assert_allclose(b.f_baseline, a.f_baseline, atol=1e-6)
        np.testing.assert_allclose(b.residual, a.residual, atol=1e-5)
        np.testing.assert_allclose(b.head_max, a.head_max, rtol=1e-4, atol=1e-7)
        fa, fb = a.families["self"], b.families["self"]
        assert (fa.nodes == fb.nodes).all() and (fa.capped == fb.capped).all()
        assert np.isnan(fa.error).all() == np.isnan(fb.error).all()


@pytest.mark.parametrize("kind", ["bert", "roberta", "electra", "distilbert"])
@pytest.mark.parametrize("options", [dict(rule="right", steps=20), dict(rule="gauss", steps=6),
                                     dict(rule="clenshaw-curtis", steps=9), dict(tol=1e-2)],
                         ids=["right20", "gauss6", "cc9", "tol"])
def test_a_group_scores_what_one_at_a_time_scores(loaded_factory, kind, options):
    scorer = Scorer(loaded_factory(kind, torch.float32), ScoreOptions(**options))
    assert grouped.groupable(scorer)
    one, together = _both(scorer)
    _assert_same(one, together)
    assert together[0].step_batch > max(a.step_batch for a in one)  # passes really held several examples
    for a, b in zip(one, together):
        if "tol" not in options:  # the embedded estimate is a difference of two sums: rounding shows more
            np.testing.assert_allclose(b.families["self"].error, a.families["self"].error, rtol=1e-3, atol=1e-6)


def test_a_group_matches_the_slow_reference_in_float64(loaded_factory):
    """Grouped numbers against the paper-exact slow reference, per example, at float64."""
    loaded = loaded_factory("bert", torch.float64)
    scorer = Scorer(loaded, ScoreOptions(rule="gauss", steps=5, dtype="float64"))
    encs = [scorer.encode(e) for e in EXAMPLES]
    results = grouped.score_group(scorer, EXAMPLES, encs)
    for enc, r in zip(encs, results):
        inputs = {"input_ids": torch.tensor([enc.input_ids]), "token_type_ids": torch.tensor([enc.token_type_ids])}
        ref, f0 = slow_attribution(scorer.model, inputs, list(r.layers), scorer.alphas, scorer.weights, r.target)
        for k, layer in enumerate(r.layers):
            scale = ref[layer].abs().max()
            assert float((torch.from_numpy(r.attribution[k]) - ref[layer]).abs().max() / scale) < 1e-9
            assert r.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)


def test_the_first_token_last_layer_is_exact_and_zero_elsewhere(loaded_factory):
    loaded = loaded_factory("bert", torch.float64)
    scorer = Scorer(loaded, ScoreOptions(rule="gauss", steps=4, dtype="float64"))
    module = scorer.sites._first_token
    assert module is not None and type(module).__name__ == "BertSelfOutput"
    cut = scorer.score(EXAMPLES[0])
    scorer.sites._first_token = None
    whole = scorer.score(EXAMPLES[0])
    assert np.abs(cut.attribution - whole.attribution).max() < 1e-12 * np.abs(whole.attribution).max()
    last = cut.attribution[-1]  # the last layer: only the first token's query row reaches the logits
    assert np.abs(last[:, 1:]).max() == 0 and np.abs(last[:, 0]).max() > 0


def test_the_first_token_cut_is_left_out_where_the_head_reads_other_rows(loaded_factory):
    for kind in ("distilbert", "gpt2", "llama", "bart"):
        scorer = Scorer(loaded_factory(kind, torch.float32), ScoreOptions(steps=2))
        assert scorer.sites._first_token is None, kind
    for kind in ("gpt2", "llama", "bart"):  # their pooled position or families: one example at a time
        assert grouped.group_size(Scorer(loaded_factory(kind, torch.float32), ScoreOptions(steps=2))) == 1, kind
    assert attention.first_token_output(torch.nn.Linear(2, 2), torch.nn.ModuleList()) is None


def test_narrow_models_get_larger_groups_up_to_the_cap(loaded_factory, monkeypatch):
    scorer = Scorer(loaded_factory("bert", torch.float32), ScoreOptions(steps=2))
    hidden = scorer.model.config.hidden_size
    sizes = {}
    for reference in (hidden, 2 * hidden, 3 * hidden, 100 * hidden):  # the model as wide as, or narrower than, MiniLM
        monkeypatch.setattr(grouped.memory, "CPU_REFERENCE_HIDDEN", reference)
        sizes[reference // hidden] = grouped.group_size(scorer)
    assert sizes == {1: grouped.DEFAULT_GROUP, 2: 2 * grouped.DEFAULT_GROUP, 3: grouped.MAX_GROUP,
                     100: grouped.MAX_GROUP}
    assert grouped.group_size(Scorer(scorer.loaded, ScoreOptions(steps=2, group=5))) == 5  # the option wins


def test_groups_cover_every_example_once_sorted_within_windows(tokenizer):
    rng = np.random.default_rng(0)
    examples = [Example(i, " ".join(["w1"] * int(rng.integers(1, 40))), None) for i in range(300)]
    examples.append(Example(300, " ".join(["w2"] * (grouped.MAX_TOKENS + 5)), None))
    encoded = {e.index: encode(tokenizer, e) for e in examples}
    groups = grouped.plan_groups(examples, encoded, 16)
    seen = [e.index for g in groups for e in g]
    assert sorted(seen) == list(range(301)) and len(seen) == 301
    assert max(len(g) for g in groups) == 16
    assert [300] in [[e.index for e in g] for g in groups]  # too long to share: alone
    for g in groups:  # similar lengths: each group comes from one window, sorted
        lengths = [len(encoded[e.index].input_ids) for e in g]
        assert lengths == sorted(lengths) and lengths[-1] <= grouped.PAD_RATIO * lengths[0] + grouped.PAD_SLACK
        assert len({e.index // (grouped.WINDOW * 16) for e in g}) == 1
    assert grouped.plan_groups(examples, encoded, 1) == [[e] for e in examples]


def test_group_one_and_the_default_write_the_same_store(tmp_path, tiny_model_dir, sst2_small):
    from attattr_cli.cli import app
    from typer.testing import CliRunner

    runner = CliRunner()
    outs = {}
    for name, extra in (("one", ["--group", "1"]), ("default", []), ("three", ["--group", "3"])):
        outs[name] = tmp_path / f"{name}.h5"
        r = runner.invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(sst2_small), "--task", "sst2",
                                "--examples", "0:7", "--tol", "1e-2", "-q", "--out", str(outs[name]), *extra])
        assert r.exit_code == 0, r.output
    with Store(outs["one"]) as a, Store(outs["default"]) as b, Store(outs["three"]) as c:
        assert a.indices() == b.indices() == c.indices() == list(range(7))
        for i in range(7):
            x = a.get(i)
            for other in (b, c):
                y = other.get(i)
                assert np.abs(x.attribution - y.attribution).max() <= 1e-5 * np.abs(x.attribution).max()
    bad = runner.invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(sst2_small), "--task", "sst2",
                              "--group", "0", "-q", "--out", str(tmp_path / "bad.h5")])
    assert bad.exit_code != 0 and "Error: --group must be at least 1, got 0" in bad.stderr
    assert not (tmp_path / "bad.h5").exists()


def test_out_of_memory_in_a_group_halves_the_rows_and_keeps_the_numbers(loaded_factory, monkeypatch):
    scorer = Scorer(loaded_factory("bert", torch.float32), ScoreOptions(steps=9))
    encs = [scorer.encode(e) for e in EXAMPLES]
    plain = grouped.score_group(scorer, EXAMPLES, encs)
    real = grouped._Group._pass
    sizes = []

    def pass_(self, site, clean, owner, *args):
        sizes.append(len(owner))
        if len(owner) > 7:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated)")
        return real(self, site, clean, owner, *args)

    monkeypatch.setattr(grouped._Group, "_pass", pass_)
    said = []
    scorer2 = Scorer(scorer.loaded, ScoreOptions(steps=9))
    scorer2.warn = said.append
    backed = grouped.score_group(scorer2, EXAMPLES, encs)
    assert len(said) == 1 and sizes[:4] == [40, 20, 10, 5] and max(sizes[4:]) <= 5  # 5 examples x 8 nodes, halved
    _assert_same(plain, backed)
