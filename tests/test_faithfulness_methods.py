"""The token importance registry and the methods added to it (Integrated Gradients,
ALTI, value zeroing, DecompX), each checked against an independent computation on a tiny
model; DecompX's masking protocol on a toy model; the adversarial-attention search."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from attattr_cli.analysis import adversarial as adv
from attattr_cli.analysis import faithfulness as fa
from attattr_cli.analysis import methods as registry
from attattr_cli.analysis import token_importance as ti
from attattr_cli.analysis.attention_edit import Edit, edited
from attattr_cli.analysis.methods import decompose, value_zeroing
from attattr_cli.errors import OptionError
from conftest import one_error_line, run_cli


# -- the registry ----------------------------------------------------------------------------

FIRST_RELEASE = ("attention_last", "attention_mean", "rollout", "attn_grad", "attr", "attr_cls", "grad",
                 "input_x_grad", "loo", "random")


def test_registry_keeps_the_first_release_and_adds_the_new_methods():
    assert registry.DEFAULT == FIRST_RELEASE == tuple(ti.METHODS)
    assert {"ig", "alti", "value_zeroing", "decompx"} <= set(registry.NAMES)
    import importlib

    cli = importlib.import_module("attattr_cli.cli.faithfulness")
    assert cli.METHODS == registry.DEFAULT and cli.ALL_METHODS == registry.NAMES
    # what defines the stored numbers is what the first release stored
    assert ti.params_for("attn_grad", "logit", "mask", 3) == {"version": 1, "output": "logit"}
    assert ti.params_for("loo", "prob", "mask", 3) == {"version": 1, "erase": "mask"}
    assert ti.params_for("random", "prob", "remove", 3) == {"version": 1, "seed": 3}
    assert ti.params_for("attention_last", "prob", "remove", 3) == {"version": 1}
    assert ti.params_for("attr", "prob", "remove", 0, {"steps": 4, "rule": "right", "output": "prob", "x": 1}) == {
        "version": 1, "steps": 4, "rule": "right", "output": "prob"}
    assert ti.params_for("attr", "prob", "remove", 0, None) == {"version": 1}
    with pytest.raises(OptionError, match="unknown token importance method 'nope'; available: .*, all"):
        ti.check_methods(["grad", "nope"])
    assert ti.check_methods(["all", "grad", "all"]) == ["all", "grad"]


def test_all_leaves_out_what_does_not_apply_and_naming_it_is_an_error(loaded_factory):
    gpt2 = loaded_factory("gpt2")
    methods, notes = ti.expand_methods(["all"], gpt2)
    assert "alti" not in methods and "decompx" not in methods
    assert {"ig", "value_zeroing", *FIRST_RELEASE} <= set(methods)
    assert any(n.startswith("alti left out: written for BERT-style encoders") for n in notes)
    with pytest.raises(OptionError, match="method 'decompx' does not apply to this model"):
        ti.expand_methods(["grad", "decompx"], gpt2)
    bert = loaded_factory("bert")
    methods, notes = ti.expand_methods(["all"], bert)
    assert notes == [] and list(methods) == list(registry.NAMES)
    roberta = loaded_factory("roberta")  # BERT layers, another classifier head
    assert "decompx" not in ti.expand_methods(["all"], roberta)[0] and "alti" in ti.expand_methods(["all"], roberta)[0]


# -- a one-layer, two-head BERT and a three-token input, computed by hand -----------------------

@pytest.fixture(scope="module")
def tiny(tokenizer):
    import transformers as tf

    from attattr_cli.models.loading import prepare

    torch.manual_seed(3)
    cfg = tf.BertConfig(vocab_size=45, hidden_size=4, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=6, max_position_embeddings=16, num_labels=2, initializer_range=0.6,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = tf.BertForSequenceClassification(cfg).double().eval()
    with torch.no_grad():  # biases that are not zero, so that every bias term is exercised
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.bias.normal_(0, 0.4)
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.3)
                mod.bias.normal_(0, 0.3)
    loaded = prepare(model, tokenizer, "tiny-one-layer")
    enc = tokenizer("w1 w7")
    n = len(enc["input_ids"])
    assert n == 4
    seg = [-1 if s is None else s for s in enc.sequence_ids()]
    ex = ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), 1, 0)
    with torch.no_grad():
        out = model(input_ids=torch.tensor([enc["input_ids"]]), token_type_ids=torch.tensor([enc["token_type_ids"]]),
                    output_hidden_states=True)
    return loaded, ex, out.hidden_states[0][0], out


def _ln(z, ln):
    mean = z.mean(-1, keepdim=True)
    var = ((z - mean) ** 2).mean(-1, keepdim=True)
    return ln.weight * (z - mean) / torch.sqrt(var + ln.eps) + ln.bias


def _by_hand(layer, x, zero=None):
    """The BERT layer written out: per head softmax(q k^T / sqrt(d_h)) v (with value
    vector ``zero`` set to 0), output dense, residual, LayerNorm, feed-forward, LayerNorm.
    Returns (output, per-head probabilities, per-head values, LayerNorm-1 output)."""
    sa, so = layer.attention.self, layer.attention.output
    heads, d = 2, x.shape[1]
    dh = d // heads
    q, k, v = sa.query(x), sa.key(x), sa.value(x)
    ctx = torch.zeros_like(x)
    probs, values = [], []
    for h in range(heads):
        sl = slice(h * dh, (h + 1) * dh)
        a = torch.softmax(q[:, sl] @ k[:, sl].T / math.sqrt(dh), -1)
        vh = v[:, sl].clone()
        if zero is not None:
            vh[zero] = 0.0
        ctx[:, sl] = a @ vh
        probs.append(a)
        values.append(v[:, sl])
    y = _ln(ctx @ so.dense.weight.T + so.dense.bias + x, so.LayerNorm)
    f = layer.intermediate.intermediate_act_fn(y @ layer.intermediate.dense.weight.T + layer.intermediate.dense.bias)
    out = _ln(f @ layer.output.dense.weight.T + layer.output.dense.bias + y, layer.output.LayerNorm)
    return out, probs, values, y


def test_the_hand_written_layer_is_the_model(tiny):
    loaded, ex, x, out = tiny
    with torch.no_grad():
        mine = _by_hand(loaded.model.bert.encoder.layer[0], x)[0]
    assert torch.allclose(mine, out.hidden_states[1][0], atol=1e-10)


def test_alti_against_a_hand_computation(tiny):
    loaded, ex, x, _ = tiny
    layer = loaded.model.bert.encoder.layer[0]
    so = layer.attention.output
    n, d = x.shape
    with torch.no_grad():
        _, probs, values, y_model = _by_hand(layer, x)
        wo = so.dense.weight
        expected = torch.zeros(n, n, dtype=torch.float64)
        for i in range(n):
            terms = []
            for j in range(n):
                t = sum(probs[h][i, j] * (values[h][j] @ wo[:, 2 * h:2 * h + 2].T) for h in range(2))
                if i == j:
                    t = t + x[i]
                terms.append(t)
            pre = sum(terms) + so.dense.bias
            s = torch.sqrt(((pre - pre.mean()) ** 2).mean() + so.LayerNorm.eps)
            y = so.LayerNorm.weight * (pre - pre.mean()) / s + so.LayerNorm.bias
            assert torch.allclose(y, y_model[i], atol=1e-10)  # the decomposition adds up to the model's vector
            c = []
            for j in range(n):
                tj = so.LayerNorm.weight * (terms[j] - terms[j].mean()) / s
                c.append(max(0.0, float(y.abs().sum() - (y - tj).abs().sum())))
            if sum(c) > 0:
                expected[i] = torch.tensor(c, dtype=torch.float64) / sum(c)
            else:  # every term is farther from y_i than y_i is from zero: the token keeps itself
                expected[i, i] = 1.0
    assert torch.allclose(expected.sum(1), torch.ones(n, dtype=torch.float64))
    run = ti.ModelRunner(loaded)
    hs, att, _ = decompose.clean_forward(run, ex)
    got = decompose.alti_matrix(layer, hs[0], att[0])
    assert torch.allclose(got, expected, atol=1e-9)
    assert run.compute(ex, ["alti"])["alti"] == pytest.approx(expected[0].numpy(), abs=1e-9)  # one layer: row 0


def test_value_zeroing_against_a_hand_computation(tiny):
    loaded, ex, x, out = tiny
    layer = loaded.model.bert.encoder.layer[0]
    n = x.shape[0]
    clean = out.hidden_states[1][0]
    expected = np.zeros((n, n))
    with torch.no_grad():
        for j in range(n):
            zeroed = _by_hand(layer, x, zero=j)[0]
            for i in range(n):
                cos = float(zeroed[i] @ clean[i] / (zeroed[i].norm() * clean[i].norm()))
                expected[i, j] = 1.0 - cos
    expected /= expected.sum(1, keepdims=True)
    run = ti.ModelRunner(loaded)
    got = value_zeroing.value_zeroing_matrices(run, ex)
    assert got.shape == (1, n, n)
    assert got[0] == pytest.approx(expected, abs=1e-9)
    assert run.compute(ex, ["value_zeroing"])["value_zeroing"] == pytest.approx(expected[0], abs=1e-9)
    m = np.random.default_rng(0).dirichlet(np.ones(3), size=(2, 3))
    assert value_zeroing.rollout_of(m) == pytest.approx(m[1] @ m[0])


def _bert_with_biases(layers: int, seed: int):
    """A float64 BERT classifier whose every bias and LayerNorm is far from its initial value,
    so that every bias term of DecompX is exercised."""
    import transformers as tf

    torch.manual_seed(seed)
    cfg = tf.BertConfig(vocab_size=45, hidden_size=8, num_hidden_layers=layers, num_attention_heads=2,
                        intermediate_size=12, max_position_embeddings=16, num_labels=3, initializer_range=0.5,
                        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = tf.BertForSequenceClassification(cfg).double().eval()
    with torch.no_grad():
        for mod in model.modules():
            if isinstance(mod, torch.nn.Linear):
                mod.bias.normal_(0, 0.4)
            if isinstance(mod, torch.nn.LayerNorm):
                mod.weight.normal_(1.0, 0.3)
                mod.bias.normal_(0, 0.3)
    return model


@pytest.mark.parametrize("layers", [1, 2])
def test_decompx_is_its_authors_computation(layers, tokenizer):
    """attattr's DecompX against a hand port of the authors' code (tests/decompx_reference.py:
    AbsDot bias split, the value bias folded into W_O b_V + b_O after the first layer, zero-origin
    slopes), on one- and two-layer BERTs and several inputs: the same parts to float rounding."""
    from scipy.stats import kendalltau

    import decompx_reference
    from attattr_cli.models.loading import prepare

    model = _bert_with_biases(layers, seed=10 + layers)
    loaded = prepare(model, tokenizer, f"tiny-{layers}-layer")
    run = ti.ModelRunner(loaded)
    for text in (("w1 w7",), ("w3 w4 w5 w9", "w2 w8"), ("w11 w12 w13 w14 w15 w16",)):
        enc = tokenizer(*text)
        seg = [-1 if s is None else s for s in enc.sequence_ids()]
        with torch.no_grad():
            ref, ref_logits = decompx_reference.decompx(model, enc["input_ids"], enc["token_type_ids"])
        for target in range(3):
            ex = ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), target, 0)
            got = run.compute(ex, ["decompx"])["decompx"]
            expected = ref[:, target].numpy()
            assert got == pytest.approx(expected, abs=1e-10, rel=1e-9)
            assert kendalltau(got, expected).statistic == pytest.approx(1.0)
        parts, logits = decompose.decompx_logits(run, ex)
        assert torch.allclose(parts.sum(0), ref_logits, atol=1e-9)  # the parts add up to every logit
        assert torch.allclose(logits, ref_logits, atol=1e-12)


def test_decompx_splits_a_bias_by_absolute_dot_products():
    """One bias over three parts: weights |part . b| / sum, not elementwise magnitudes."""
    parts = torch.tensor([[[1.0, 0.0], [0.0, 2.0], [-1.0, -1.0]]], dtype=torch.float64)
    b = torch.tensor([2.0, 1.0], dtype=torch.float64)
    got = decompose.share_bias(parts, b)
    dots = torch.tensor([2.0, 2.0, 3.0], dtype=torch.float64)
    expected = parts + (dots / (dots.sum() + 1e-12))[None, :, None] * b
    assert torch.allclose(got, expected)
    assert torch.allclose(got.sum(-2), parts.sum(-2) + b)


def test_decompx_parts_add_up_to_every_logit_of_a_deeper_model(loaded_factory, tokenizer):
    loaded = loaded_factory("bert", dtype=torch.float64)
    enc = tokenizer("w1 w2 w3 w4 w5", "w6 w7 w8")
    seg = [-1 if s is None else s for s in enc.sequence_ids()]
    ex = ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), 2, 0)
    parts, logits = decompose.decompx_logits(ti.ModelRunner(loaded), ex)
    with torch.no_grad():
        direct = loaded.model(input_ids=torch.tensor([enc["input_ids"]]),
                              token_type_ids=torch.tensor([enc["token_type_ids"]])).logits[0]
    assert torch.allclose(parts.sum(0), direct, atol=1e-9) and torch.allclose(logits, direct, atol=1e-12)


def test_integrated_gradients_against_a_riemann_sum(tiny):
    pytest.importorskip("captum")
    from attattr_cli.analysis.methods.ig import integrated_gradients

    loaded, ex, _, _ = tiny
    model = loaded.model
    run = ti.ModelRunner(loaded, output="prob")
    got, delta = integrated_gradients(run, ex, steps=20)
    ids = torch.tensor([list(ex.input_ids)])
    tt = torch.tensor([list(ex.token_type_ids)])
    emb = model.get_input_embeddings()(ids).detach()[0]
    base = emb.clone()
    base[ex.content] = 0.0  # the words go to zero, [CLS] and [SEP] stay

    def f(e):
        return torch.softmax(model(inputs_embeds=e[None], token_type_ids=tt).logits[0], -1)[ex.target]

    steps = 400
    total = torch.zeros_like(emb)
    for s in range(steps):
        point = (base + (s + 0.5) / steps * (emb - base)).requires_grad_(True)
        (g,) = torch.autograd.grad(f(point), point)
        total += g / steps
    expected = ((emb - base) * total).sum(-1).detach().numpy()
    assert got == pytest.approx(expected, abs=1e-5)
    assert got[0] == 0.0 and got[-1] == 0.0  # special tokens do not move
    with torch.no_grad():
        assert got.sum() == pytest.approx(float(f(emb) - f(base)), abs=1e-5)  # completeness
    assert abs(delta) < 1e-5


def test_integrated_gradients_raises_its_points_until_completeness_holds(tiny):
    """The adaptive rule: points doubled until |sum IG - (F(x) - F(b))| <= tol x scale; the
    error, points and state of every example are kept; a cap too low flags the example."""
    pytest.importorskip("captum")
    from attattr_cli.analysis.methods import ig

    loaded, ex, _, _ = tiny
    run = ti.ModelRunner(loaded, output="prob")
    first, delta2 = ig.integrated_gradients(run, ex, steps=2)
    scores = ig.adaptive_ig(run, ex, steps=2, max_steps=256, tol=1e-9)
    note = run.notes["ig"][ex.index]
    change = note["change"]
    scale = max(abs(change), float(np.abs(scores).max()))
    assert note["converged"] and note["steps"] > 2
    assert abs(scores.sum() - change) <= 1e-9 * scale + 1e-10  # completeness, to the tolerance asked
    assert abs(note["completeness_error"]) <= 1e-9 * scale + 1e-10
    assert abs(delta2) > abs(note["completeness_error"])  # two points were not enough
    # the same example with a cap below what it needs: flagged, the error kept
    run2 = ti.ModelRunner(loaded, output="prob")
    ig.adaptive_ig(run2, ex, steps=2, max_steps=2, tol=1e-9)
    flagged = run2.notes["ig"][ex.index]
    assert not flagged["converged"] and flagged["steps"] == 2 and flagged["completeness_error"] == pytest.approx(delta2)
    summ = ig.summary(run2.notes["ig"])
    assert summ["flagged"] == 1 and summ["flagged_examples"] == [ex.index]
    # the registered method is the adaptive one, and its stored parameters say so
    assert registry.REGISTRY["ig"].store_params(registry.Settings())["version"] == 2


# -- DecompX's masking protocol on a toy model -----------------------------------------------

WEIGHTS = np.array([0.0, 0.05, 0.3, 0.0, 0.02, 0.2, 0.04, 0.1, 0.01, 0.05, 0.03, 0.0])
CONTENT = np.arange(1, 11)


def _toy_probs(keeps):
    p1 = np.array([0.1 + WEIGHTS[np.asarray(k)].sum() for k in keeps])
    return np.stack([1 - p1, p1], 1)


def test_masking_protocol_on_a_toy_model():
    out = fa.mask_metrics(_toy_probs, 12, CONTENT, {"perfect": WEIGHTS.copy(), "worst": -WEIGHTS}, target=1, label=1,
                          bounds=WEIGHTS.copy())
    ranked = np.sort(WEIGHTS[CONTENT])[::-1]  # 0.3 0.2 0.1 0.05 0.05 0.04 0.03 0.02 0.01 0.0
    drops = np.cumsum(ranked)[:9]  # K = 10 % ... 90 % of 10 tokens: k = 1 ... 9
    assert out["perfect"]["aopc_bins"] == pytest.approx(list(drops))
    assert out["perfect"]["aopc"] == pytest.approx(drops.mean())
    worst = np.cumsum(ranked[::-1])[:9]
    assert out["worst"]["aopc"] == pytest.approx(worst.mean())
    # p1 after masking = 0.9 - drop; predicted class 1 while p1 > 0.5
    assert out["perfect"]["accuracy_bins"] == [float(0.9 - x > 0.5) for x in drops]
    assert out["perfect"]["accuracy"] == pytest.approx(np.mean([0.9 - x > 0.5 for x in drops]))
    assert out["worst"]["accuracy"] == pytest.approx(8 / 9)  # only k = 9 (drop 0.5) flips the class
    assert out["worst"]["kept"] == out["worst"]["accuracy"]  # label = target here
    wrong = fa.mask_metrics(_toy_probs, 12, CONTENT, {"perfect": WEIGHTS.copy()}, target=1, label=0)["perfect"]
    assert wrong["kept"] == out["perfect"]["kept"] and wrong["accuracy"] == pytest.approx(1 - out["perfect"]["accuracy"])
    assert out["perfect"]["naopc"] == pytest.approx(1.0) and out["worst"]["naopc"] == pytest.approx(0.0)
    mid = fa.mask_metrics(_toy_probs, 12, CONTENT, {"m": np.arange(12.0)}, 1, 1, bounds=WEIGHTS.copy())["m"]
    assert mid["naopc"] == pytest.approx((mid["aopc"] - worst.mean()) / (drops.mean() - worst.mean()))
    flat = fa.mask_metrics(lambda keeps: np.full((len(keeps), 2), 0.5), 12, CONTENT, {"a": WEIGHTS}, 1, 0)
    assert flat["a"]["naopc"] is None and flat["a"]["aopc"] == 0.0


# -- adversarial attention -------------------------------------------------------------------

def test_simplex_projection_and_jsd_by_hand():
    v = torch.tensor([[0.5, 0.5, 0.5], [2.0, 0.0, 0.0], [0.6, 0.3, -0.2], [0.2, 0.3, 0.5]], dtype=torch.float64)
    # third row: sorted 0.6, 0.3, -0.2; two entries stay; theta = (0.9 - 1) / 2 = -0.05
    expected = [[1 / 3] * 3, [1.0, 0.0, 0.0], [0.65, 0.35, 0.0], [0.2, 0.3, 0.5]]
    assert adv.project_simplex(v).numpy() == pytest.approx(np.array(expected))
    assert adv.jsd_np([1, 0], [0, 1]) == pytest.approx(math.log(2))
    assert adv.jsd_np([0.2, 0.8], [0.2, 0.8]) == pytest.approx(0.0)
    p, q = np.array([0.1, 0.6, 0.3]), np.array([0.5, 0.25, 0.25])
    m = (p + q) / 2
    assert adv.jsd_np(p, q) == pytest.approx(0.5 * (p * np.log(p / m)).sum() + 0.5 * (q * np.log(q / m)).sum())


def test_edited_attention_is_plain_when_unchanged_and_restores_the_model(loaded_factory, tokenizer):
    loaded = loaded_factory("bert", dtype=torch.float64)
    model = loaded.model
    ids = torch.tensor([tokenizer("w1 w2 w3")["input_ids"]])
    before = model.config._attn_implementation
    with torch.no_grad():
        plain = model(input_ids=ids).logits
        with edited(model, Edit(1, lambda p: p)):
            same = model(input_ids=ids).logits
        with edited(model, Edit(1, lambda p: torch.zeros_like(p))):
            zero = model(input_ids=ids).logits
    assert torch.allclose(plain, same, atol=1e-12) and not torch.allclose(plain, zero)
    with pytest.raises(RuntimeError, match="boom"):
        with edited(model, Edit(0, lambda p: p)):
            raise RuntimeError("boom")
    assert model.config._attn_implementation == before


def test_adversarial_search_stays_within_epsilon_and_attribution_is_complete(loaded_factory, tokenizer):
    loaded = loaded_factory("bert", dtype=torch.float64, num_labels=2)
    model = loaded.model
    enc = tokenizer("w1 w2 w3 w4 w5 w6")
    seg = [-1 if s is None else s for s in enc.sequence_ids()]
    ex = ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), 1, 0)
    run = ti.ModelRunner(loaded)
    site = adv._Site(run, ex, -1)
    ids = torch.tensor([enc["input_ids"]])
    with torch.no_grad():
        p0 = torch.softmax(model(input_ids=ids).logits[0], -1)
    opts = adv.AdversarialOptions(iterations=30, restarts=3)
    for eps in (0.01, 0.05):
        best = adv.search(site, eps, opts, torch.Generator().manual_seed(0))
        rows = best["rows"]
        assert torch.allclose(rows.sum(-1), torch.ones(rows.shape[0], dtype=rows.dtype)) and (rows >= 0).all()
        full = site.attention.clone()
        full[:, 0] = rows
        with torch.no_grad(), edited(model, Edit(site.layer, lambda p: full[None].to(p.dtype))):
            p1 = torch.softmax(model(input_ids=ids).logits[0], -1)  # a whole forward, nothing replayed
        tvd = 0.5 * float((p1 - p0).abs().sum())
        assert tvd <= eps + 1e-12 and tvd == pytest.approx(best["tvd"], abs=1e-9)
        a = site.attention[:, 0].numpy()
        js = np.mean([adv.jsd_np(a[h], rows[h].numpy()) for h in range(a.shape[0])])
        assert js == pytest.approx(best["jsd"], abs=1e-12) and 0 < js <= math.log(2)
    # attribution of the edited layer: sum = F(A) - F(0 at that layer) up to the midpoint rule
    attr = site.attribution(site.attention, 40)
    with torch.no_grad(), edited(model, Edit(site.layer, lambda p: torch.zeros_like(p))):
        f_zero = float(torch.softmax(model(input_ids=ids).logits[0], -1)[1])
    assert float(attr.sum()) == pytest.approx(float(p0[1]) - f_zero, abs=2e-4)
    res = adv.adversarial_example(run, ex, adv.AdversarialOptions(epsilons=(0.05,), iterations=10, restarts=2))
    r = res["epsilons"]["0.05"]
    assert set(r) == set(adv.ADV_METRICS) and r["tvd_output"] <= 0.05 and res["layer"] == 2


# -- the command -------------------------------------------------------------------------------

def test_cli_all_methods_and_adversarial_on_builtin_default(tmp_path):
    report, svg = tmp_path / "r.json", tmp_path / "r.svg"
    r = run_cli("faithfulness", "--out", report, "--examples", "0:2", "--steps", "2", "--permutations", "0",
                "--methods", "all", "--adversarial", "--epsilons", "0.02,0.05", "--csv", "--plot", svg)
    assert r.exit_code == 0, r.output
    data = json.loads(report.read_text())
    from io import StringIO

    from rich.console import Console

    import importlib

    command = importlib.import_module("attattr_cli.cli.faithfulness")

    shown = StringIO()  # the tables the command prints on stderr without --csv
    console = Console(file=shown, width=200)
    for table in (command._adversarial_table(data), command._mask_table(data)):
        console.print(table)
    assert "adversarial attention" in shown.getvalue() and "masking protocol (DecompX)" in shown.getvalue()
    assert "NAOPC" in shown.getvalue()
    assert list(data["methods"]) == list(registry.NAMES) and data["left_out"] == []
    for m in ("ig", "alti", "value_zeroing", "decompx"):
        e = data["methods"][m]
        assert e["mask_aopc_low"] <= e["mask_aopc"] <= e["mask_aopc_high"]
        assert len(e["mask_aopc_bins"]) == 9 and 0 <= e["mask_accuracy"] <= 1
    a = data["adversarial"]
    assert set(a["summary"]) == {"0.02", "0.05"} and len(a["per_example"]) == 2
    assert all(e["epsilons"]["0.02"]["tvd_output"] <= 0.02 for e in a["per_example"])
    assert {t["baseline"] for t in data["paired_tests"]} >= {"ig", "alti", "decompx", "value_zeroing", "random"}
    ig = data["completeness"]["ig"]  # IG's completeness error of every example, checked against its tolerance
    assert ig["examples"] == 2 and ig["max_abs_error"] is not None
    assert ig["flagged"] == 0 or ig["max_steps_used"] == 320
    assert "ig: completeness error at most" in r.stderr
    lines = r.stdout.strip().splitlines()  # --csv: the rows on stdout
    assert lines[0].startswith("section,method") and sum(x.startswith("adversarial,") for x in lines) == 2
    assert sum(x.startswith("methods,") for x in lines) == len(registry.NAMES)
    assert svg.read_text().lstrip().startswith("<?xml")


def test_cli_adversarial_errors_are_one_line(tmp_path):
    out = tmp_path / "r.json"
    one_error_line(run_cli("faithfulness", "--out", out, "--epsilons", "0.05"), "--epsilons goes with --adversarial")
    one_error_line(run_cli("faithfulness", "--out", out, "--adversarial", "--epsilons", "0.05,2"),
                   "--epsilons are total variation distances in (0, 1)")
    one_error_line(run_cli("faithfulness", "--out", out, "--adversarial", "--epsilons", "a"),
                   "--epsilons: not a list of numbers")
    one_error_line(run_cli("faithfulness", "--out", out, "--methods", "ig,alll"), "unknown token importance method 'alll'")
    assert not out.exists()


def test_docs_table_is_the_registry():
    from pathlib import Path

    docs = (Path(__file__).resolve().parents[1] / "docs" / "faithfulness.md").read_text()
    start = docs.index("<!-- registry table: attattr_cli.analysis.methods.markdown_table() -->\n")
    end = docs.index("<!-- end of registry table -->")
    assert docs[start:end].split("\n", 1)[1] == registry.markdown_table()


def test_value_zeroing_in_small_batches_is_the_same(loaded_factory, tokenizer):
    loaded = loaded_factory("bert", dtype=torch.float64)
    enc = tokenizer("w1 w2 w3 w4 w5", "w6 w7")
    seg = [-1 if s is None else s for s in enc.sequence_ids()]
    ex = ti.Prepared(0, np.array(enc["input_ids"]), np.array(enc["token_type_ids"]), np.array(seg), 0, 0)
    whole = value_zeroing.value_zeroing_matrices(ti.ModelRunner(loaded), ex)
    small = value_zeroing.value_zeroing_matrices(ti.ModelRunner(loaded, max_tokens=3 * ex.n), ex)
    assert small == pytest.approx(whole, abs=1e-9)  # batch sizes differ in the last bits only
    assert whole.sum(-1) == pytest.approx(np.ones(whole.shape[:2]))
