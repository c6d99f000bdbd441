"""Contrastive targets (a foil), per-step attribution of a generation, and words: each checked
against the slow reference of tests/slow_reference.py (float64, tiny configs) and completeness."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attattr_cli.data.types import Example
from attattr_cli.engine.encoding import Encoded
from attattr_cli.engine.integrate import nodes
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.run import scorer_for
from attattr_cli.engine.scorer import Scorer
from attattr_cli.errors import OptionError
from attattr_cli.models.loading import prepare
from conftest import build_model, with_sentiment_labels
from slow_reference import slow_attribution

PROMPT = Example(0, "w1 w2 w3 w4 w5 w6")


@pytest.fixture
def make(tokenizer):
    def _make(kind="llama", dtype=torch.float64, layers=2, lm=True):
        model = build_model(kind, dtype, num_labels=2, layers=layers, lm=lm)
        if not lm:
            model = with_sentiment_labels(model)
        return prepare(model, tokenizer, f"tiny-{kind}", lm=lm)

    return _make


def _rel(a, b):
    a, b = torch.as_tensor(np.asarray(a)), torch.as_tensor(np.asarray(b))
    return float((a - b).abs().max() / b.abs().max())


# -- contrastive targets -------------------------------------------------------------------
@pytest.mark.parametrize("output", ["prob", "logprob", "logit"])
def test_lm_foil_equals_slow_reference_of_the_difference(make, output):
    loaded = make()
    scorer = Scorer(loaded, ScoreOptions(steps=8, dtype="float64", lm=True, target_token="w5", foil="w9",
                                         output=output))
    result = scorer.score(PROMPT)
    enc = scorer.encode(PROMPT)
    t, f = loaded.tokenizer.convert_tokens_to_ids(["w5", "w9"])
    lm = result.meta["lm"]
    assert lm["target_ids"] == [t] and lm["foil_id"] == f and lm["foil_token"] == "w9"

    def out(lg, tok):
        lg = lg[:, -1]
        if output == "logit":
            return lg[:, tok]
        lp = torch.log_softmax(lg, -1)[:, tok]
        return lp if output == "logprob" else lp.exp()

    alphas, weights = nodes("right", 8)
    ref, f0 = slow_attribution(loaded.model, {"input_ids": torch.tensor([enc.input_ids])}, result.layers, alphas,
                               weights, None, f_of_logits=lambda lg: out(lg, t) - out(lg, f),
                               more_inputs={"use_cache": False, "logits_to_keep": torch.tensor(enc.lm_positions)})
    for k, layer in enumerate(result.layers):
        assert _rel(result.attribution[k], ref[layer]) < 1e-6
        assert result.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)
    with torch.no_grad():
        lg = loaded.model(torch.tensor([enc.input_ids])).logits[:, -1:]
    assert result.f_full == pytest.approx(float(out(lg, t) - out(lg, f)), rel=1e-9)


def test_foil_completeness_with_tol(make):
    loaded = make()
    result = Scorer(loaded, ScoreOptions(tol=1e-3, dtype="float64", lm=True, foil="w9", output="logprob")).score(PROMPT)
    effect = result.f_full - result.f_baseline
    assert np.abs(result.residual).max() < 1e-3 * max(np.abs(effect).max(), 1e-12) + 1e-9
    assert np.abs(result.attribution.sum(axis=(1, 2, 3)) - effect).max() < 1e-3 * np.abs(effect).max() + 1e-9


def test_classifier_foil_is_the_class_difference(make):
    loaded = make("bert", lm=False)
    ex = Example(0, "w1 w2 w3 w4", "w5 w6")
    plain = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="positive", output="logit", group=1)).score(ex)
    other = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="negative", output="logit", group=1)).score(ex)
    both = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="positive", foil="negative",
                                       output="logit", group=1)).score(ex)
    # the integral is linear in F: the difference's attribution is the difference of attributions
    assert _rel(both.attribution, plain.attribution - other.attribution) < 1e-9
    assert both.f_full == pytest.approx(plain.f_full - other.f_full, rel=1e-9)
    assert both.meta["foil"]["label"] == "negative"
    from attattr_cli.engine.grouped import score_group

    grouped = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", target="positive", foil="negative",
                                          output="logit"))
    exs = [ex, Example(1, "w7 w8", "w9 w1 w2")]
    outs = score_group(grouped, exs, [grouped.encode(e) for e in exs])
    assert _rel(outs[0].attribution, both.attribution) < 1e-9
    with pytest.raises(OptionError, match="--foil names one class"):
        Scorer(loaded, ScoreOptions(foil="predicted"))
    with pytest.raises(OptionError, match="--foil 'w1 w2' is 2 tokens"):
        Scorer(make(), ScoreOptions(lm=True, foil="w1 w2"))


# -- per-step attribution of a generation ------------------------------------------------------
def _step_reference(loaded, ids, position, token, output, alphas, weights, foil=None):
    """The slow reference of one step: the prefix that ends at ``position`` alone, F the
    output of ``token`` at its last position."""
    def out(lg, tok):
        lg = lg[:, -1]
        if output == "logit":
            return lg[:, tok]
        lp = torch.log_softmax(lg, -1)[:, tok]
        return lp if output == "logprob" else lp.exp()

    f_of = (lambda lg: out(lg, token)) if foil is None else (lambda lg: out(lg, token) - out(lg, foil))
    return slow_attribution(loaded.model, {"input_ids": torch.tensor([ids[:position + 1]])}, list(range(2)), alphas,
                            weights, None, f_of_logits=f_of, more_inputs={"use_cache": False})


@pytest.mark.parametrize("opts", [
    {"generate": 3, "output": "logprob"},
    {"continuation": "w7 w8 w9", "per_step": True},
    {"generate": 2, "foil": "w9", "output": "logit"},
])
@pytest.mark.parametrize("kind", ["llama", "gpt2"])
def test_every_step_equals_the_slow_reference(make, kind, opts):
    loaded = make(kind)
    scorer = scorer_for(loaded, ScoreOptions(steps=6, rule="gauss", dtype="float64", lm=True, step_batch=5, **opts))
    result = scorer.score(PROMPT)
    enc = scorer.encode(PROMPT)
    steps = result.steps
    assert len(steps) == len(enc.lm_targets) == (opts.get("generate") or 3)
    alphas, weights = nodes("gauss", 6)
    foil = None if "foil" not in opts else loaded.tokenizer.convert_tokens_to_ids(opts["foil"])
    total = 0
    for t, st in enumerate(steps):
        assert st.position == enc.lm_positions[t] and st.target == enc.lm_targets[t]
        n_t = st.position + 1
        ref, f0 = _step_reference(loaded, enc.input_ids, st.position, st.target, scorer.options.output,
                                  alphas, weights, foil)
        fs = st.family
        assert fs.attribution.shape == (2, 4, n_t, n_t)
        for k in range(2):
            assert _rel(fs.attribution[k], ref[k]) < 1e-5, (t, k)
            assert fs.f_baseline[k] == pytest.approx(f0[k], rel=1e-9, abs=1e-12)
        total = total + np.pad(fs.attribution, ((0, 0), (0, 0), (0, len(enc.input_ids) - n_t),
                                                (0, len(enc.input_ids) - n_t)))
    # the example's own maps are those of the sum of the steps' F
    assert np.abs(result.attribution - total).max() < 1e-9 * np.abs(total).max()
    assert result.f_full == pytest.approx(sum(st.f_full for st in steps), rel=1e-12)
    if "generate" in opts:  # greedy: every generated token is the arg-max at its position
        assert [st.target for st in steps] == [st.pred for st in steps]


def test_steps_with_tol_converge_and_are_complete(make):
    loaded = make()
    scorer = scorer_for(loaded, ScoreOptions(tol=1e-3, dtype="float64", lm=True, generate=3, output="logprob"))
    result = scorer.score(PROMPT)
    one = Scorer(loaded, ScoreOptions(tol=1e-3, dtype="float64", lm=True, output="logprob"))
    enc = scorer.encode(PROMPT)
    p = result.steps[1].position
    prefix = Encoded(enc.input_ids[:p + 1], enc.tokens[:p + 1], [0] * (p + 1), None, lm_positions=[p],
                     lm_targets=[result.steps[1].target])
    alone = one.score(PROMPT, encoded=prefix)
    for st in result.steps:
        fs = st.family
        effect = st.f_full - fs.f_baseline
        assert (fs.status == 0).all()
        assert np.abs(fs.residual).max() <= 1e-3 * np.abs(effect).max() + 1e-9
    # step 1 against a one-token run of its prefix (both to a tolerance of 1e-3 of max |Attr|)
    assert _rel(result.steps[1].family.attribution, alone.attribution) < 1e-2


def test_long_inputs_share_a_nodes_forward_between_the_steps_that_want_it(make, monkeypatch):
    """Steps refining to --tol on their own nodes: on a long input a node wanted by several
    steps is one forward (one node per pass) and a backward per step that wants it; the
    numbers are those of a pass per row, with fewer forwards."""
    from attattr_cli.engine import generation, sweep

    monkeypatch.setattr(sweep, "usable", lambda *a, **k: False)  # the per-layer passes of long inputs
    paths = []
    original_shared, original_rows = generation.StepScorer._shared, generation.StepScorer._rows

    def shared(self, site, clean, owner, alphas, weights, box, one_node=False):
        paths.append(("one node" if one_node else "shared", len(alphas), len(set(alphas.tolist()))))
        yield from original_shared(self, site, clean, owner, alphas, weights, box, one_node)

    def rows(self, site, clean, owner, alphas, weights, box):
        paths.append(("rows", len(alphas), len(set(alphas.tolist()))))
        yield from original_rows(self, site, clean, owner, alphas, weights, box)

    monkeypatch.setattr(generation.StepScorer, "_shared", shared)
    monkeypatch.setattr(generation.StepScorer, "_rows", rows)
    loaded = make(layers=3)
    opts = ScoreOptions(tol=1e-6, dtype="float64", lm=True, generate=3, output="logprob")
    results = {}
    for long_from in (10 ** 9, 0):  # rows, then one node per pass
        monkeypatch.setattr(generation, "LONG_SHARED", long_from)
        paths.clear()
        results[long_from] = (scorer_for(loaded, opts).score(PROMPT), list(paths))
    (by_rows, rows_paths), (by_node, node_paths) = results[10 ** 9], results[0]
    assert any(kind == "rows" and u < r for kind, r, u in rows_paths)  # steps wanted some nodes in common
    assert [(r, u) for _, r, u in node_paths] == [(r, u) for _, r, u in rows_paths]
    assert all(kind == "one node" for kind, r, u in node_paths if kind != "shared" and u < r)
    assert sum(u for kind, r, u in node_paths if kind == "one node") < sum(r for kind, r, u in rows_paths if kind == "rows")
    for a, b in zip(by_node.steps, by_rows.steps):
        np.testing.assert_allclose(a.family.attribution, b.family.attribution, rtol=1e-9, atol=1e-12)
        np.testing.assert_array_equal(a.family.nodes, b.family.nodes)


@pytest.mark.parametrize("tol", [None, 1e-2], ids=["fixed", "tol"])
def test_a_bfloat16_generation_by_layer_passes_gives_the_sweeps_numbers(make, tol):
    """bfloat16, the steps sharing each node's forward one layer at a time (the passes of long
    inputs): each step's gradients are added in the accumulation dtype (they once went into a
    bfloat16 buffer and the assignment failed), and the maps are the sweeps' up to bfloat16
    rounding."""
    loaded = make(dtype=torch.float32)
    opts = ScoreOptions(lm=True, dtype="bfloat16", generate=3, steps=None if tol else 4, tol=tol)
    results = []
    for swept in (True, False):
        scorer = scorer_for(loaded, opts)
        scorer.sweep = swept
        results.append(scorer.score(PROMPT))
    for a, b in zip(*(r.steps for r in results)):
        assert _rel(a.family.attribution, b.family.attribution) < 5e-2


def test_generation_options_refused(make):
    with pytest.raises(OptionError, match="--per-step goes with --continuation"):
        ScoreOptions(lm=True, per_step=True).check()
    with pytest.raises(OptionError, match="--generate and --per-step need --lm"):
        ScoreOptions(generate=2).check()
    with pytest.raises(OptionError, match="does not go with --continuation"):
        ScoreOptions(lm=True, generate=2, continuation="w1").check()
    with pytest.raises(OptionError, match="--generate must be at least 1"):
        ScoreOptions(lm=True, generate=0).check()


# -- the store and the command line --------------------------------------------------------------


def test_cli_generate_store_steps_and_api(llama_dir, tmp_path):
    from attattr_cli.store import Store
    from conftest import run_cli

    out = tmp_path / "g.h5"
    r = run_cli("score", "--lm", "--model", llama_dir, "--prompt", "w1 w2 w3 w4", "--generate", "3", "--foil", "w9",
                "--logprob", "--steps", "4", "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    with Store(out) as s:
        assert s.schema_version == "1.6"
        e = s.get(0)
        assert len(e.steps) == 3 and e.meta["lm"]["per_step"] and e.meta["lm"]["foil_token"] == "w9"
        n = len(e.tokens)
        for t, st in enumerate(e.steps):
            assert st.tokens == e.tokens[:n - 2 + t] and st.attribution.shape == (2, 4, n - 2 + t, n - 2 + t)
            assert st.meta["step"]["step"] == t and st.meta["step"]["foil"] >= 0
            assert np.abs(st.attribution.sum(axis=(1, 2, 3)) - (st.f_full - st.f_baseline)).max() \
                == pytest.approx(np.abs(st.residual).max(), abs=1e-4)
        summed = sum(np.pad(st.attribution, ((0, 0), (0, 0), (0, n - len(st.tokens)), (0, n - len(st.tokens))))
                     for st in e.steps)
        assert np.abs(e.attribution - summed).max() < 1e-5 * np.abs(summed).max()
    older = tmp_path / "older.h5"  # the same store as schema 1.3 wrote it: no steps, read as before
    import shutil

    import h5py

    shutil.copy(out, older)
    with h5py.File(older, "a") as f:
        del f["examples/00000000/steps"]
        f.attrs["schema_version"] = "1.3"
    with Store(older) as s:
        assert s.get(0).steps is None and s.summary()["generations"] is None
        assert np.array_equal(s.get(0).attribution, e.attribution)
    r = run_cli("info", out)
    assert r.exit_code == 0 and "generations" in r.stdout and "3 steps" in r.stdout, r.output
    r = run_cli("info", out, "--json")
    import json

    gen = json.loads(r.stdout)["generations"]
    assert gen["steps_total"] == 3 and gen["step_abs_residual_max"] == pytest.approx(
        max(np.abs(st.residual).max() for st in e.steps))
    import attattr_cli as aa

    model = aa.load_model(str(llama_dir), lm=True)
    res = aa.score(model, ["w1 w2 w3 w4"], generate=3, foil="w9", output="logprob", steps=4)
    assert [st.target for st in res[0].steps] == [st.target for st in e.steps]
    assert _rel(res[0].steps[2].attribution, e.steps[2].attribution) < 1e-5
    same = aa.score(model, ["w1 w2 w3 w4"], continuation=" ".join(st.tokens[-1] for st in e.steps[1:]) + " "
                    + e.meta["lm"]["target_tokens"][-1], per_step=True, foil="w9", output="logprob", steps=4)
    assert _rel(same[0].steps[1].attribution, e.steps[1].attribution) < 1e-5


# -- words and spans -------------------------------------------------------------------------------
def test_word_groups_of_each_tokenizer_style():
    from attattr_cli.analysis.aggregate import span_groups, word_groups, word_text

    assert word_groups(["[CLS]", "cl", "##iche", "film", ".", "[SEP]"]) == [[0], [1, 2], [3], [4], [5]]
    bpe = ["Paris", "Ġis", "Ġthe", "Ġcap", "ital", "Ġ", "1", "8", "8", "9", ","]
    assert word_groups(bpe) == [[0], [1], [2], [3, 4], [5, 6, 7, 8, 9], [10]]
    assert word_text(bpe[3:5]) == "capital"
    assert word_groups(["ĠParis", ".", "Ċ", "The", "re"]) == [[0], [1], [2], [3, 4]]  # a line break is a word
    assert word_groups(["▁Par", "is", "▁is"]) == [[0, 1], [2]]
    assert word_groups(["a", "b", "c"], word_ids=[None, 0, 0]) == [[0], [1, 2]]
    assert span_groups(5, [(1, 3)]) == [[0], [1, 2], [3], [4]]
    with pytest.raises(OptionError, match="overlaps"):
        span_groups(5, [(1, 3), (2, 4)])


def test_aggregate_words_keeps_completeness(make):
    from attattr_cli.analysis.aggregate import aggregate_example
    from attattr_cli.api.results import Attribution

    loaded = make("bert", lm=False)
    r = Scorer(loaded, ScoreOptions(steps=4, dtype="float64", group=1)).score(Example(0, "w1 w2 w3", "w4 w5"))
    from attattr_cli.store.reader import StoredExample
    import dataclasses

    fields = {f.name for f in dataclasses.fields(StoredExample)}
    e = Attribution(**{k: getattr(r, k) for k in fields if hasattr(r, k)}, family="self", keep="maps",
                    key_tokens=None, head_sum=None)
    assert e.tokens == ["[CLS]", "w1", "w2", "w3", "[SEP]", "w4", "w5", "[SEP]"]
    spans = e.aggregate([(1, 3), (5, 7)])
    assert spans.tokens == ["[CLS]", "w1 w2", "w3", "[SEP]", "w4 w5", "[SEP]"]
    # sums over merged queries and keys: every layer's total (= F(A) - F(0) + residual) is unchanged
    assert np.allclose(spans.attribution.sum(axis=(1, 2, 3)), e.attribution.sum(axis=(1, 2, 3)))
    assert spans.attribution[0, 0, 1, 1] == pytest.approx(e.attribution[0, 0, 1:3, 1:3].sum())
    assert np.allclose(spans.attention.sum(-1), 1.0)  # attention rows still sum to 1
    assert spans.head_max.shape == e.head_max.shape
    same = aggregate_example(e, "words")
    assert same.tokens == e.tokens  # whole-word vocabulary: nothing merges


def test_generation_view_step_source_words(llama_dir, tmp_path):
    from attattr_cli.analysis.aggregate import step_source
    from attattr_cli.store import Store
    from conftest import run_cli

    out = tmp_path / "g.h5"
    r = run_cli("score", "--lm", "--model", llama_dir, "--prompt", "w1 w2 w3", "--generate", "3", "--steps", "2",
                "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    with Store(out) as s:
        e = s.get(0)
    m, rows, cols, f_rows, by_layer = step_source(e, words=False)
    assert m.shape == (3, len(e.tokens)) and len(rows) == 3
    for t, st in enumerate(e.steps):  # each row: the step's token importance, NaN beyond its prefix
        assert np.allclose(m[t, :len(st.tokens)], st.token_importance())
        assert np.isnan(m[t, len(st.tokens):]).all()
    assert np.allclose(np.nansum(by_layer, 0), np.nan_to_num(m))
    for fmt in ("png", "svg", "html"):
        r = run_cli("view", out, "-n", "0", "-o", tmp_path / f"g.{fmt}")
        assert r.exit_code == 0, r.output
        assert "3 generated words x" in r.stderr
        assert (tmp_path / f"g.{fmt}").stat().st_size > 1000
    r = run_cli("view", out, "-n", "0", "-o", tmp_path / "w.svg", "--whole", "--no-tree", "--aggregate", "words")
    assert r.exit_code == 0, r.output


def test_tree_of_a_step_in_words(llama_dir, tmp_path):
    from conftest import run_cli

    out = tmp_path / "g.h5"
    r = run_cli("score", "--lm", "--model", llama_dir, "--prompt", "w1 w2 w3", "--generate", "2", "--steps", "2",
                "--quiet", "--out", out)
    assert r.exit_code == 0, r.output
    r = run_cli("tree", out, "-n", "0", "--step", "1", "--aggregate", "words", "-f", "json")
    assert r.exit_code == 0, r.output
    import json

    tree = json.loads(r.stdout)
    assert len(tree["tokens"]) == 6  # [CLS] w1 w2 w3 [SEP] + the first generated token
    r = run_cli("tree", out, "-n", "0", "--step", "5")
    assert r.exit_code != 0 and "has 2 generation steps" in r.stderr


def test_sampling_is_seeded(make):
    loaded = make()
    ids = [scorer_for(loaded, ScoreOptions(lm=True, generate=6, sample_seed=seed)).encode(PROMPT).lm_targets
           for seed in (3, 3, 4)]
    greedy = scorer_for(loaded, ScoreOptions(lm=True, generate=6)).encode(PROMPT)
    assert ids[0] == ids[1] and len(ids[0]) == 6
    assert ids[2] != ids[0] or ids[0] != greedy.lm_targets  # another seed (or greedy) gives other tokens
    logits = loaded.model(torch.tensor([greedy.input_ids])).logits[0].argmax(-1)
    assert greedy.lm_targets[:-1] == logits[greedy.lm_positions[0]:-1].tolist()  # greedy: the arg-max each time
    with pytest.raises(OptionError, match="--sample"):
        ScoreOptions(lm=True, sample_seed=1).check()


def test_steps_keep_sum_and_top_k_in_the_store(llama_dir, tmp_path):
    import attattr_cli as aa

    model = aa.load_model(str(llama_dir), lm=True)
    maps = aa.score(model, ["w1 w2 w3"], generate=2, steps=2)[0]
    summed = aa.score(model, ["w1 w2 w3"], generate=2, steps=2, keep="sum", top_k=3)[0]
    for a, b in zip(maps.steps, summed.steps):
        assert b.attribution is None and b.head_sum.shape == a.attribution.sum(1).shape
        assert np.allclose(b.head_sum, a.attribution.sum(1), atol=1e-6)
        assert b.topk_value.shape == (2, 4, 3)
        assert np.allclose(b.token_importance(), a.token_importance(), atol=1e-5)
    m, rows, cols = summed.step_source(words=False)
    assert m.shape == (2, len(summed.tokens)) and len(cols) == len(summed.tokens)


def test_generation_in_a_notebook(llama_dir, tmp_path, monkeypatch):
    """What a notebook shows of a generation: a short repr, a still picture (the generated text
    and the step x source matrix, no script), plot() the matrix's Figure, to_pandas() one row
    per step with the stored numbers."""
    import html
    import re

    import attattr_cli as aa
    from attattr_cli.analysis.aggregate import step_source
    from attattr_cli.views.data import format_number

    model = aa.load_model(str(llama_dir), lm=True)
    res = aa.score(model, prompts=["w1 w2 w3"], generate=3, foil="w9", output="logprob", steps=2)
    g = res[0]
    targets = [st.meta["step"]["target_token"] for st in g.steps]
    assert repr(g).startswith("Attribution(index=0, generation of 3 steps (generated), generated="
                              f"{' '.join(targets)!r}, foil='w9', target log p(token) - log p(w9)")
    assert repr(res).startswith("Results(1 generations") and len(repr(g)) < 300
    table = res._repr_html_()  # the table of generations: prompt, generated text, steps, foil
    assert all(f">{c}<" in table for c in ("prompt", "generated", "steps", "foil", "w1 w2 w3", " ".join(targets), "w9"))
    page = g._repr_html_()
    assert "<script" not in page and html.escape(" ".join(targets)) in page
    m = step_source(g, words=True)[0]
    svg = re.search(r'<svg[^>]*aa-step-matrix.*?</svg>', page, re.S).group(0)
    tips = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg)]
    assert len(tips) == m.size
    assert [t.rsplit(": ", 1)[1] for t in tips] == [format_number(v, signed=True) if np.isfinite(v)
                                                    else "not in the step's prefix" for v in m.ravel()]
    assert page.count('class="aa-step-matrix"') == 1 + 2  # and one per layer behind a click
    from attattr_cli.views import steps as steps_mod

    monkeypatch.setattr(steps_mod, "TIP_CELLS", m.size - 1)  # larger matrices: compact, no values on hover
    monkeypatch.setattr(steps_mod, "LAYER_CELLS", 2 * m.size - 1)  # and their per-layer matrices a note
    small = g._repr_html_()
    assert "<title>" not in small and small.count('class="aa-step-matrix"') == 1
    assert "plot(per_layer=True)" in small and len(small) < len(page)
    df = g.to_pandas()
    assert list(df["step"]) == [0, 1, 2] and list(df["token"]) == targets and set(df["foil"]) == {"w9"}
    assert np.allclose(df["target_value"], [st.f_full for st in g.steps])
    assert np.allclose(df["max_abs_residual"], [np.abs(st.residual).max() for st in g.steps])
    assert list(df["converged"]) == [st.converged for st in g.steps]
    assert list(df["position"]) == g.meta["lm"]["positions"]
    assert np.allclose(df["foil_probability"], g.meta["lm"]["foil_probs"])
    assert res.to_pandas().equals(df) and len(g.to_pandas("heads")) == 2 * 4
    fig = g.plot(tmp_path / "g.png")
    ax = fig.axes[0]
    assert [t.get_text().split(" (")[0] for t in ax.get_yticklabels()] == targets  # whole-word vocabulary
    assert np.allclose(np.ma.filled(ax.images[0].get_array(), np.nan), m, equal_nan=True)
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(g.plot(per_layer=True).axes) > len(fig.axes)  # one panel per layer more
    view = g.save(tmp_path / "g.html")  # what `attattr view` writes for a generation
    assert view.rows == targets and "<h2>Steps</h2>" in (tmp_path / "g.html").read_text()
    shown = []
    monkeypatch.setattr("attattr_cli.views.notebook.display", shown.append)
    assert g.show() is None and len(shown) == 1 and "aa-step-matrix" in str(shown[0])  # displayed once, as a result shows
    with pytest.raises(OptionError, match="give prompts or inputs, not both"):
        aa.score(model, ["w1"], prompts=["w2"], generate=1)
    plain = aa.score(model, ["w1 w2 w3"], steps=2)[0]  # not a generation: no steps table
    with pytest.raises(OptionError, match="not a generation scored step by step"):
        plain.to_pandas("steps")
    assert list(plain.to_pandas().columns)[:3] == ["example", "layer", "head"]  # its default: the heads table
    assert "generation" not in repr(plain) and plain.plot().axes  # its plot: the view's figure


def test_generation_without_maps_shows_its_steps(llama_dir, tmp_path):
    """A generation kept without maps (keep none) has no step x source matrix: its notebook
    display and its report say so and still list the steps."""
    import attattr_cli as aa

    model = aa.load_model(str(llama_dir), lm=True)
    res = aa.score(model, prompts=["w1 w2 w3"], generate=2, steps=2, keep="none")
    page = res[0]._repr_html_()
    assert "no step x source matrix" in page and "aa-step-matrix" not in page
    assert page.count("<tr>") == 1 + 2 and len(res[0].to_pandas()) == 2
    with pytest.raises(OptionError, match="keeps no maps"):
        res[0].plot()
    res.save(tmp_path / "g.h5")
    done = aa.report(tmp_path / "g.h5", tmp_path / "r.html")
    assert done.examples == 1 and "no step x source matrix" in (tmp_path / "r.html").read_text()
