"""Quadrature rules, their embedded error estimates and the error-controlled integration."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from attattr_cli.engine import adaptive
from attattr_cli.engine.integrate import RULES, clenshaw_curtis, doubling_levels, embedded, nodes
from attattr_cli.engine.run import ScoreRequest, prepare_run
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.scorer import Scorer
from slow_reference import slow_attribution

# integrands with known integrals over [0, 1]: smooth, Runge's, and a steep sigmoid (the shape
# of a saturating probability along the path)
FUNCTIONS = {
    "exp": (lambda a: np.exp(3 * a), (math.exp(3) - 1) / 3),
    "runge": (lambda a: 1 / (1 + 25 * (2 * a - 1) ** 2), math.atan(5) / 5),
    "sigmoid": (lambda a: 1 / (1 + np.exp(-60 * (a - 0.07))),
                1 + (math.log1p(math.exp(-60 * 0.93)) - math.log1p(math.exp(60 * 0.07))) / 60),
}


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 64])
def test_clenshaw_curtis_is_exact_for_polynomials_of_degree_n(n):
    alphas, weights = clenshaw_curtis(n)
    assert alphas[0] == 0.0 and alphas[-1] == 1.0 and np.all(np.diff(alphas) > 0)
    for degree in range(n + 1 + (n % 2 == 0)):
        assert float(weights @ alphas ** degree) == pytest.approx(1 / (degree + 1), abs=1e-13)


def test_doubling_levels_are_nested_and_respect_the_cap():
    levels = list(doubling_levels(33))
    assert [len(keys) for keys, _, _ in levels] == [2, 3, 5, 9, 17, 33]
    for (k0, a0, _), (k1, a1, _) in zip(levels, levels[1:]):
        assert set(k0) <= set(k1)
        where = {k: a for k, a in zip(k1, a1)}
        assert all(where[k] == a for k, a in zip(k0, a0))  # the same float for the same node


@pytest.mark.parametrize("rule", list(RULES))
@pytest.mark.parametrize("steps", [2, 3, 4, 5, 6, 8, 9, 12, 20])
def test_embedded_rules_are_rules_on_the_same_nodes(rule, steps):
    if rule in ("gauss", "clenshaw-curtis") and steps == 2:
        assert embedded(rule, steps) is None  # no symmetric rule on fewer nodes
        return
    low, divisor = embedded(rule, steps)
    assert low.shape == (steps,) and divisor >= 1
    assert low.sum() == pytest.approx(1.0, abs=1e-12)  # integrates constants
    alphas = nodes(rule, steps)[0].numpy()
    if (rule == "midpoint" and steps % 2) or (rule in ("gauss", "clenshaw-curtis") and steps >= 3):
        assert float(low @ alphas) == pytest.approx(0.5, abs=1e-12)  # and linear functions


@pytest.mark.parametrize("rule,steps", [("right", 20), ("left", 20), ("right", 15), ("left", 7), ("midpoint", 9)])
def test_embedded_estimate_of_the_riemann_rules_is_close_to_their_error(rule, steps):
    f, exact = FUNCTIONS["exp"]
    alphas, weights = (t.numpy() for t in nodes(rule, steps))
    low, divisor = embedded(rule, steps)
    true = abs(weights @ f(alphas) - exact)
    estimate = abs((weights - low) @ f(alphas)) / divisor
    assert 0.5 * true < estimate < 2 * true


@pytest.mark.parametrize("rule,steps", [("gauss", 3), ("gauss", 4), ("gauss", 8), ("clenshaw-curtis", 9),
                                        ("clenshaw-curtis", 8)])
def test_embedded_estimate_of_the_polynomial_rules_bounds_their_error(rule, steps):
    alphas, weights = (t.numpy() for t in nodes(rule, steps))
    low, divisor = embedded(rule, steps)
    for name in ("exp", "runge"):  # (a feature between all nodes is beyond any estimate from them)
        f, exact = FUNCTIONS[name]
        assert abs((weights - low) @ f(alphas)) / divisor >= abs(weights @ f(alphas) - exact)


class _Field:
    """A made-up layer: the 'gradient' at alpha is f(alpha) times a fixed tensor, and
    'Attr' of a G is G itself, so the exact map is integral(f) times that tensor."""

    def __init__(self, f):
        self.f = f
        self.shape = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64).view(3, 4)
        self.calls: list[list[float]] = []

    def evaluate(self, alphas):
        self.calls.append(alphas.tolist())
        values = torch.from_numpy(self.f(alphas.numpy()))
        return values.view(-1, 1, 1) * self.shape, values

    @staticmethod
    def magnitude(g):
        return float(g.abs().max())


DRIVERS = {"doubling": adaptive.integrate}


@pytest.mark.parametrize("driver", list(DRIVERS))
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-7])
def test_adaptive_rule_meets_its_tolerance_on_known_integrals(driver, name, tol):
    f, exact = FUNCTIONS[name]
    field = _Field(f)
    one = field.evaluate(torch.ones(1, dtype=torch.float64))[0][0]
    field.calls.clear()
    res = DRIVERS[driver](field.evaluate, field.magnitude, tol, max_nodes=257, known={adaptive.ONE: one})
    true = float((res.g - exact * field.shape).abs().max() / (exact * field.shape).abs().max())
    assert not res.capped
    assert true <= res.error <= tol
    assert all(a != 1.0 for call in field.calls for a in call)  # alpha = 1 was given, never evaluated
    assert len(field.calls[0]) == 4  # the 5-node level (and the 3-node level below it) in one call
    assert res.evaluated == sum(len(c) for c in field.calls) == res.nodes - 1
    assert res.f[adaptive.ZERO] == pytest.approx(f(np.zeros(1))[0])


@pytest.mark.parametrize("driver", list(DRIVERS))
def test_adaptive_rule_says_when_the_node_cap_stops_it(driver):
    f, exact = FUNCTIONS["sigmoid"]
    field = _Field(f)
    res = DRIVERS[driver](field.evaluate, field.magnitude, 1e-9, max_nodes=9)
    assert res.capped and res.nodes <= 9 and res.error > 1e-9
    true = float((res.g - exact * field.shape).abs().max() / (exact * field.shape).abs().max())
    assert true <= res.error  # the estimate still bounds the error of what is returned


def test_adaptive_rule_refuses_bad_arguments():
    field = _Field(FUNCTIONS["exp"][0])
    with pytest.raises(ValueError, match="positive"):
        adaptive.integrate(field.evaluate, field.magnitude, 0.0)
    with pytest.raises(ValueError, match="at least 3"):
        adaptive.integrate(field.evaluate, field.magnitude, 1e-3, max_nodes=2)


# -- the scorer --------------------------------------------------------------------------------

def test_tol_in_the_scorer_equals_the_slow_reference_at_the_nodes_it_chose(loaded_factory):
    from attattr_cli.data.types import Example

    scorer = Scorer(loaded_factory("bert", torch.float64), ScoreOptions(tol=1e-4, dtype="float64"))
    example = Example(0, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1)
    result = scorer.score(example)
    fam = result.families["self"]
    assert scorer.options.rule == "clenshaw-curtis"
    assert not fam.capped.any() and (fam.error <= 1e-4).all()
    enc = scorer.encode(example)
    inputs = {"input_ids": torch.tensor([enc.input_ids]), "token_type_ids": torch.tensor([enc.token_type_ids])}
    for k, layer in enumerate(result.layers):
        alphas, weights = nodes("clenshaw-curtis", int(fam.nodes[k]))
        ref, f0 = slow_attribution(scorer.model, inputs, [layer], alphas, weights, result.target)
        assert float((torch.from_numpy(result.attribution[k]) - ref[layer]).abs().max() / ref[layer].abs().max()) < 1e-9
        assert result.f_baseline[k] == pytest.approx(f0[layer], rel=1e-9)


@pytest.mark.parametrize("rule,steps", [("right", 20), ("left", 20), ("gauss", 6), ("midpoint", 7)])
def test_fixed_rules_are_unchanged_by_their_error_estimate(loaded_factory, rule, steps):
    """The estimate rides along: with it switched off the numbers are the same, bit for bit."""
    from attattr_cli.data.types import Example

    loaded = loaded_factory("bert", torch.float32)
    example = Example(0, "w1 w2 w3 w4 w5", "w6 w7 w8", label=1)
    for step_batch in (None, 3):
        with_estimate = Scorer(loaded, ScoreOptions(rule=rule, steps=steps, step_batch=step_batch))
        without = Scorer(loaded, ScoreOptions(rule=rule, steps=steps, step_batch=step_batch))
        without.low = None
        a, b = with_estimate.score(example), without.score(example)
        assert np.array_equal(a.attribution, b.attribution) and np.array_equal(a.residual, b.residual)
        assert np.array_equal(a.f_baseline, b.f_baseline)
        assert np.isfinite(a.families["self"].error).all() and np.isnan(b.families["self"].error).all()
        assert (a.families["self"].nodes == steps).all()


def test_error_estimate_bounds_the_true_error_on_the_builtin_default():
    """--tol's estimate against a converged reference (Gauss-Legendre, 128 nodes, float64)."""
    def prep(options, loaded=None):
        return prepare_run(ScoreRequest(out="unused.h5", examples="0:3", options=options, command=["test"]), loaded)

    reference = prep(ScoreOptions(rule="gauss", steps=128, dtype="float64"))
    adaptive_run = prep(ScoreOptions(tol=1e-2, dtype="float64"), reference.loaded)
    for e in reference.picked:
        ref = reference.scorer.score(e, reference.encoded[e.index])
        r = adaptive_run.scorer.score(e, adaptive_run.encoded[e.index])
        fam = r.families["self"]
        for k in range(len(r.layers)):
            true = np.abs(r.attribution[k] - ref.attribution[k]).max() / np.abs(ref.attribution[k]).max()
            assert true <= fam.error[k] <= 1e-2 or fam.capped[k], (e.index, k)
        assert not fam.capped.all()


def test_score_tol_writes_convergence_to_the_store_and_info_summarises_it(tmp_path):
    import json

    from typer.testing import CliRunner

    from attattr_cli.cli import app
    from attattr_cli.store import Store

    runner = CliRunner()
    out = tmp_path / "tol.h5"
    result = runner.invoke(app, ["score", "--out", str(out), "--examples", "0:2", "--tol", "1e-2", "--max-nodes", "17", "-q"])
    assert result.exit_code == 0, result.output
    with Store(out) as s:
        assert s.provenance["options"]["rule"] == "clenshaw-curtis" and s.provenance["options"]["tol"] == 0.01
        nodes_seen = []
        for i in (0, 1):
            e = s.get(i)
            assert e.nodes.shape == e.error_estimate.shape == e.node_cap_hit.shape == (len(e.layers),)
            assert set(e.nodes.tolist()) <= {3, 5, 9, 17}
            assert ((e.error_estimate <= 1e-2) | e.node_cap_hit).all()
            nodes_seen += e.nodes.tolist()
    fams = json.loads(runner.invoke(app, ["info", str(out), "--json"]).stdout)["families"]["self"]
    assert fams["nodes_mean"] == pytest.approx(np.mean(nodes_seen)) and fams["nodes_max"] == max(nodes_seen)
    assert fams["error_estimate_max"] <= 1e-2 or fams["node_cap_hits"] > 0
    assert "nodes mean" in runner.invoke(app, ["info", str(out)]).stdout

    fixed = tmp_path / "fixed.h5"
    assert runner.invoke(app, ["score", "--out", str(fixed), "--examples", "0:1", "--steps", "4", "-q"]).exit_code == 0
    with Store(fixed) as s:
        e = s.get(0)
        assert (e.nodes == 4).all() and np.isfinite(e.error_estimate).all() and not e.node_cap_hit.any()


@pytest.mark.parametrize("args,rule,steps,tol", [
    ([], "clenshaw-curtis", 20, 0.1),  # nothing chosen: the error-controlled default
    (["--steps", "20"], "right", 20, None),  # the paper's setting
    (["--rule", "left"], "left", 20, None),  # the 2021 code's rule, 20 steps
    (["--rule", "gauss", "--steps", "6"], "gauss", 6, None),
    (["--tol", "0.3"], "clenshaw-curtis", 20, 0.3),
])
def test_score_default_is_error_controlled_and_a_rule_or_steps_mean_a_fixed_rule(tmp_path, args, rule, steps, tol):
    from typer.testing import CliRunner

    import attattr_cli.api as aa
    from attattr_cli.cli import app
    from attattr_cli.engine.options import DEFAULT_TOL
    from attattr_cli.store import Store

    out = tmp_path / "s.h5"
    result = CliRunner().invoke(app, ["score", "--out", str(out), "--examples", "0:2", "-q", *args])
    assert result.exit_code == 0, result.output
    with Store(out) as s:
        options = s.provenance["options"]
        assert (options["rule"], options["steps"], options.get("tol")) == (rule, steps, tol)
        nodes = np.concatenate([s.get(i).nodes for i in (0, 1)])
        stored = [s.get(i).attribution for i in (0, 1)]
    if tol is None:
        assert (nodes == steps).all()
    else:
        assert set(nodes.tolist()) <= {5, 9, 17, 33, 65, 129}
    assert DEFAULT_TOL == 0.1
    # the API resolves its defaults the same way, and gives the store's numbers
    kwargs = {"steps": int(args[args.index("--steps") + 1])} if "--steps" in args else {}
    kwargs.update({"rule": args[args.index("--rule") + 1]} if "--rule" in args else {})
    kwargs.update({"tol": float(args[args.index("--tol") + 1])} if "--tol" in args else {})
    res = aa.score(examples="0:2", **kwargs)
    for r, a in zip(res, stored):
        assert np.array_equal(r.attribution, a)
        assert (r.nodes == steps).all() if tol is None else set(r.nodes.tolist()) <= {5, 9, 17, 33, 65, 129}


def test_a_store_from_the_paper_rule_says_how_to_extend_it_under_the_new_default(tmp_path):
    from typer.testing import CliRunner

    from attattr_cli.cli import app
    from attattr_cli.store import Store

    out = tmp_path / "paper.h5"
    runner = CliRunner()
    assert runner.invoke(app, ["score", "--out", str(out), "--examples", "0:1", "--steps", "20", "-q"]).exit_code == 0
    before = out.read_bytes()
    result = runner.invoke(app, ["score", "--out", str(out), "--examples", "0:2", "-q"])
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "rule='right', steps=20" in lines[0] and "give that rule and steps to extend it" in lines[0]
    assert out.read_bytes() == before  # nothing written
    assert runner.invoke(app, ["score", "--out", str(out), "--examples", "0:2", "--steps", "20", "-q"]).exit_code == 0
    with Store(out) as s:
        assert len(s) == 2


@pytest.mark.parametrize("args,message", [
    (["--tol", "1e-3", "--rule", "left"], "Error: --tol chooses Clenshaw-Curtis nodes itself; it does not go with --rule left"),
    (["--tol", "0"], "Error: --tol must be positive, got 0.0"),
    (["--tol", "1e-3", "--max-nodes", "2"], "Error: --max-nodes must be at least 3, got 2"),
])
def test_score_tol_refuses_bad_options_with_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from attattr_cli.cli import app

    result = CliRunner().invoke(app, ["score", "--out", str(tmp_path / "x.h5"), "--examples", "0:1", *args])
    assert result.exit_code != 0
    assert [line for line in result.stderr.splitlines() if line.strip()] == [message]
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("kind", ["bart", "gpt2"])
def test_tol_on_every_family_equals_the_fixed_rule_at_the_nodes_it_chose(tokenizer, kind):
    """Encoder-decoder families (encoder, decoder, cross) and a causal LM: each layer's map
    under --tol is the fixed Clenshaw-Curtis rule with the node count that layer chose."""
    from conftest import build_model

    from attattr_cli.data.types import Example
    from attattr_cli.models.loading import prepare

    lm = kind != "bart"
    model = build_model(kind, torch.float64, num_labels=2, layers=2, lm=lm)
    if not lm:
        model.config.id2label, model.config.label2id = {0: "negative", 1: "positive"}, {"negative": 0, "positive": 1}
    loaded = prepare(model, tokenizer, f"tiny-{kind}", lm=lm)
    example = Example(0, "w1 w2 w3 w4 w5 w6")
    result = Scorer(loaded, ScoreOptions(tol=1e-3, dtype="float64", lm=lm)).score(example)
    fixed = {}
    for name, fam in result.families.items():
        assert (fam.error <= 1e-3).all() and not fam.capped.any()
        for k, layer in enumerate(fam.layers):
            m = int(fam.nodes[k])
            if m not in fixed:
                fixed[m] = Scorer(loaded, ScoreOptions(rule="clenshaw-curtis", steps=m, dtype="float64", lm=lm)).score(example)
            ref = fixed[m].families[name]
            assert np.abs(fam.head_max[k] - ref.head_max[k]).max() <= 1e-9 * np.abs(ref.head_max[k]).max()
            assert fam.f_baseline[k] == pytest.approx(ref.f_baseline[k], rel=1e-12)
            assert fam.residual[k] == pytest.approx(ref.residual[k], abs=1e-10)
