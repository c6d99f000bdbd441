"""Quadrature rules, their embedded error estimates and the error-controlled integration."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from attattr_cli.engine import adaptive
from attattr_cli.engine.integrate import RULES, clenshaw_curtis, embedded, nodes
from attattr_cli.engine.run import ScoreRequest, prepare_run
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.scorer import Scorer
from slow_reference import slow_attribution

# integrands with known integrals over [0, 1], each with its antiderivative (F along the path):
# smooth, Runge's, and a steep sigmoid (the shape of a saturating probability along the path)
_SIG = 60.0
FUNCTIONS = {
    "exp": (lambda a: np.exp(3 * a), lambda a: (np.exp(3 * a) - 1) / 3),
    "runge": (lambda a: 1 / (1 + 25 * (2 * a - 1) ** 2), lambda a: (np.arctan(5 * (2 * a - 1)) + math.atan(5)) / 10),
    "sigmoid": (lambda a: 1 / (1 + np.exp(-_SIG * (a - 0.07))),
                lambda a: (np.logaddexp(0, _SIG * (a - 0.07)) - np.logaddexp(0, -_SIG * 0.07)) / _SIG),
}


def _exact(name):
    return float(FUNCTIONS[name][1](np.ones(1))[0])


@pytest.mark.parametrize("n", [1, 2, 3, 4, 7, 8, 16, 64])
def test_clenshaw_curtis_is_exact_for_polynomials_of_degree_n(n):
    alphas, weights = clenshaw_curtis(n)
    assert alphas[0] == 0.0 and alphas[-1] == 1.0 and np.all(np.diff(alphas) > 0)
    for degree in range(n + 1 + (n % 2 == 0)):
        assert float(weights @ alphas ** degree) == pytest.approx(1 / (degree + 1), abs=1e-13)


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
    f, exact = FUNCTIONS["exp"][0], _exact("exp")
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
        f, exact = FUNCTIONS[name][0], _exact(name)
        assert abs((weights - low) @ f(alphas)) / divisor >= abs(weights @ f(alphas) - exact)


class _Field:
    """A made-up layer: the 'gradient' at alpha is f(alpha) times a fixed tensor, 'Attr' of a
    G is G itself, and F along the path is the antiderivative of f times the tensor's sum (so
    that sum Attr at a node is dF/dalpha, as for a real layer); ``jump`` adds a step to F
    that no gradient sees (a routing switch)."""

    def __init__(self, f, antiderivative, jump=None):
        self.f, self.F, self.jump = f, antiderivative, jump
        self.shape = torch.linspace(-1.0, 2.0, 12, dtype=torch.float64).view(3, 4)
        self.calls: list[list[float]] = []

    def big_f(self, alphas):
        out = self.F(alphas) * float(self.shape.sum())
        if self.jump is not None:
            at, size = self.jump
            out = out + size * (alphas >= at)
        return out

    def evaluate(self, alphas):
        self.calls.append(alphas.tolist())
        values = torch.from_numpy(self.f(alphas.numpy()))
        return values.view(-1, 1, 1) * self.shape, torch.from_numpy(self.big_f(alphas.numpy()))

    @staticmethod
    def measure(g):
        return float(g.abs().max()), float(g.abs().sum()), float(g.sum())

    def run(self, tol, max_nodes=129):
        one = self.evaluate(torch.ones(1, dtype=torch.float64))[0][0]
        f_one = float(self.big_f(np.ones(1))[0])
        self.calls.clear()
        return adaptive.integrate(self.evaluate, self.measure, tol, max_nodes, {adaptive.ONE: one},
                                  {adaptive.ONE: f_one})

    def true_error(self, res, exact):
        return float((res.g - exact * self.shape).abs().max() / (exact * self.shape).abs().max())


@pytest.mark.parametrize("name", ["exp", "runge"])
def test_a_floor_judges_a_small_layer_against_the_examples_scale(name):
    """With a floor (the largest kept number of the example's other layers, --keep sources) a
    layer is judged against that scale: fewer nodes, and its error is within tol of the floor."""
    field = _Field(*FUNCTIONS[name])
    own = field.run(1e-4, max_nodes=257)
    one = field.evaluate(torch.ones(1, dtype=torch.float64))[0][0]
    f_one = float(field.big_f(np.ones(1))[0])
    scale = 1e3 * float(own.g.abs().max())
    floored = adaptive.integrate(field.evaluate, field.measure, 1e-4, 257, {adaptive.ONE: one}, {adaptive.ONE: f_one},
                                 floor=scale)
    assert floored.status == adaptive.CONVERGED and floored.nodes < own.nodes
    exact = _exact(name) * field.shape
    assert float((floored.g - exact).abs().max()) <= 1e-4 * scale


def test_per_integral_floors_judge_each_integral_on_its_own_scale():
    """Integrals refined in lock-step (a generation's steps) each take their own floor: the
    floored one ends with fewer nodes, within tol of its floor; the other one as if alone."""
    field = _Field(*FUNCTIONS["runge"])
    alone = field.run(1e-4, max_nodes=257)
    one = field.evaluate(torch.ones(1, dtype=torch.float64))[0][0]
    f_one = float(field.big_f(np.ones(1))[0])
    scale = 1e3 * float(alone.g.abs().max())
    both = adaptive.Refinement(lambda g, rows: torch.tensor([list(field.measure(x)) for x in g], dtype=torch.float64),
                               2, 1e-4, 257, {adaptive.ONE: torch.stack([one, one])}, {adaptive.ONE: [f_one, f_one]})
    both.floors = [0.0, scale]
    while not both.done:
        owner, keys, alphas = both.wanted()
        grads, f = field.evaluate(torch.from_numpy(alphas))
        both.give(owner, keys, grads, f)
    own, floored = both.result(0), both.result(1)
    assert own.nodes == alone.nodes and torch.equal(own.g, alone.g)
    assert floored.status == adaptive.CONVERGED and floored.nodes < own.nodes
    assert float((floored.g - _exact("runge") * field.shape).abs().max()) <= 1e-4 * scale


@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("tol", [1e-2, 1e-4, 1e-6])
def test_adaptive_rule_meets_its_tolerance_on_known_integrals(name, tol):
    field = _Field(*FUNCTIONS[name])
    res = field.run(tol, max_nodes=257)
    assert not res.capped and res.status == adaptive.CONVERGED
    assert field.true_error(res, _exact(name)) <= res.error <= tol  # the estimate bounds the error returned
    assert all(a != 1.0 for call in field.calls for a in call)  # alpha = 1 was given, never evaluated
    assert len(field.calls[0]) == 2  # the whole path's three-node start (alpha = 0, 1/2) in one call
    assert res.evaluated == sum(len(c) for c in field.calls) == res.nodes - 1
    assert res.f[adaptive.ZERO] == pytest.approx(0.0, abs=1e-12)
    # the weights it reports are the rule it used: applied to f they give the map
    total = sum(w * FUNCTIONS[name][0](np.array([adaptive.alpha_of(k)]))[0] for k, w in res.weights.items())
    assert float(res.g[0, 0] / field.shape[0, 0]) == pytest.approx(total, rel=1e-12)


def _bump(a):  # a narrow early bump between every node of the first leaf (alpha = 0.02, width 0.005)
    return 0.3 + 100.0 * np.exp(-((a - 0.02) / 0.005) ** 2)


def _bump_integral(a):
    return 0.3 * a + 100.0 * 0.005 * math.sqrt(math.pi) / 2 * (
        np.vectorize(math.erf)((a - 0.02) / 0.005) - math.erf(-0.02 / 0.005))


def test_an_early_change_the_nested_levels_miss_is_refined_by_the_completeness_check():
    """The integrand moves between all nodes of the first leaf: its two rules agree (the old
    estimate would stop there, 75 % off) but F(0.146) - F(0) says the integral is larger."""
    alphas, upper = clenshaw_curtis(4)
    lower = clenshaw_curtis(2)[1]
    old_estimate = abs(upper @ _bump(alphas) - lower @ _bump(alphas[0::2])) / abs(upper @ _bump(alphas))
    exact = float(_bump_integral(np.ones(1))[0])
    assert old_estimate < 1e-4 and abs(upper @ _bump(alphas) - exact) / exact > 0.5
    field = _Field(_bump, _bump_integral)
    for tol in (1e-1, 1e-2, 1e-3):
        res = field.run(tol)
        assert res.status == adaptive.CONVERGED and not res.capped, (tol, res)
        assert field.true_error(res, exact) <= 2 * tol, (tol, field.true_error(res, exact))
        assert res.leaves > 1 and res.nodes < 129
        assert min(k for k in res.weights if k > 0) < 0.1  # it went looking near alpha = 0


def test_a_kink_refines_locally():
    """A kink in the integrand at alpha = 0.6 (F'' jumps): the leaves near it are split more
    than the rest."""
    f = lambda a: np.abs(a - 0.6) + 0.1  # noqa: E731
    big_f = lambda a: np.where(a < 0.6, 0.1 * a + 0.6 * a - a * a / 2, 0.1 * a + 0.18 + (a - 0.6) ** 2 / 2)  # noqa: E731
    field = _Field(f, big_f)
    exact = float(big_f(np.ones(1))[0])
    res = field.run(1e-5)
    assert res.status == adaptive.CONVERGED and field.true_error(res, exact) <= 1e-5
    keys = sorted(res.weights)
    gaps = np.diff([adaptive.alpha_of(k) for k in keys])
    near = [g for k, g in zip(keys, gaps) if abs(adaptive.alpha_of(k) - 0.6) < 0.05]
    assert min(near) < min(g for k, g in zip(keys, gaps) if adaptive.alpha_of(k) < 0.4 and k > 0.1)


def test_a_jump_of_f_along_the_path_is_flagged_non_smooth():
    """F jumps at alpha = 0.3 (the gradient does not see it, as when expert routing switches):
    the integral of the gradient is still right, and the layer is flagged."""
    field = _Field(*FUNCTIONS["exp"], jump=(0.3, 5.0))  # sum |Attr| is 70 here: the jump is 7 % of it
    res = field.run(1e-2)
    assert res.status == adaptive.NON_SMOOTH
    assert field.true_error(res, _exact("exp")) <= 1e-2
    assert res.residual == pytest.approx(-5.0, abs=0.05)  # the jump is what completeness misses
    smooth = _Field(*FUNCTIONS["exp"]).run(1e-2)
    assert smooth.status == adaptive.CONVERGED and abs(smooth.residual) < 1e-2 * 70


def test_adaptive_rule_says_when_the_node_cap_stops_it():
    field = _Field(*FUNCTIONS["sigmoid"])
    res = field.run(1e-9, max_nodes=9)
    assert res.capped and res.nodes <= 9 and res.error > 1e-9 and res.status == adaptive.CAP_HIT
    assert field.true_error(res, _exact("sigmoid")) <= res.error  # the estimate still bounds the error returned


def test_lock_step_refinement_serves_different_nodes_per_integral():
    """Two integrals in one Refinement: each gets the nodes it needs in the same passes."""
    fields = [_Field(*FUNCTIONS["exp"]), _Field(_bump, _bump_integral)]

    def measure(g, rows):
        return torch.tensor([list(_Field.measure(x)) for x in g], dtype=torch.float64)

    ones = torch.stack([fl.evaluate(torch.ones(1, dtype=torch.float64))[0][0] for fl in fields])
    f_one = [float(fl.big_f(np.ones(1))[0]) for fl in fields]
    refining = adaptive.Refinement(measure, 2, 1e-3, 129, {adaptive.ONE: ones}, {adaptive.ONE: f_one})
    rounds = []
    while not refining.done:
        owner, keys, alphas = refining.wanted()
        assert owner.tolist() == sorted(owner.tolist())  # integral-major, as the passes expect
        grads, fs = zip(*[fields[i].evaluate(torch.tensor([a], dtype=torch.float64)) for i, a in zip(owner.tolist(), alphas)])
        rounds.append({i: sorted(k for o, k in zip(owner.tolist(), keys) if o == i) for i in set(owner.tolist())})
        refining.give(owner, keys, torch.cat(grads), torch.cat(fs))
    assert any(len(r) == 2 and r[0] != r[1] for r in rounds)  # one pass, different nodes
    for i, exact in ((0, _exact("exp")), (1, float(_bump_integral(np.ones(1))[0]))):
        res = refining.result(i)
        assert res.status == adaptive.CONVERGED and fields[i].true_error(res, exact) <= 2e-3


def test_adaptive_rule_refuses_bad_arguments():
    field = _Field(*FUNCTIONS["exp"])
    with pytest.raises(ValueError, match="positive"):
        adaptive.integrate(field.evaluate, field.measure, 0.0)
    with pytest.raises(ValueError, match="at least 5"):
        adaptive.integrate(field.evaluate, field.measure, 1e-3, max_nodes=4)


def test_fixed_rules_are_judged_by_estimate_and_residual():
    eps = float(np.finfo(np.float32).eps)
    assert adaptive.judge(0.05, 1e-3, 1.0, 1.0, 0.1, eps, eps) == adaptive.CONVERGED
    assert adaptive.judge(0.5, 1e-3, 1.0, 1.0, 0.1, eps, eps) == adaptive.ESTIMATE
    assert adaptive.judge(0.05, 0.63, 1.0, 1.0, 0.1, eps, eps) == adaptive.RESIDUAL
    assert adaptive.judge(float("nan"), 1e-3, 1.0, 1.0, 0.1, eps, eps) == adaptive.CONVERGED  # no estimate: residual only
    assert adaptive.judge(0.05, 1e-6, 0.0, 1.0, 0.1, eps, eps) == adaptive.CONVERGED  # within the float floor


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
    """--tol against a converged reference (Gauss-Legendre, 128 nodes, float64): what it calls
    converged is within the tolerance."""
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
            assert fam.error[k] <= 1e-2 or fam.status[k] != adaptive.CONVERGED, (e.index, k)
            assert true <= 1e-2 or fam.status[k] != adaptive.CONVERGED, (e.index, k, true)
        assert (fam.status == adaptive.CONVERGED).any()


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
            assert set(e.nodes.tolist()) <= {5, 9, 13, 17}  # the first leaf's 5, then 4 per split
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
    ([], "clenshaw-curtis", None, 0.1),  # nothing chosen: the error-controlled default
    (["--steps", "20"], "right", 20, None),  # the paper's setting
    (["--rule", "left"], "left", 20, None),  # the 2021 code's rule, 20 steps
    (["--rule", "gauss", "--steps", "6"], "gauss", 6, None),
    (["--tol", "0.3"], "clenshaw-curtis", None, 0.3),
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
        assert all(n == 3 or (n >= 5 and (n - 5) % 4 == 0) for n in nodes.tolist())  # 3, 5, then 4 per split
    assert DEFAULT_TOL == 0.1
    # the API resolves its defaults the same way, and gives the store's numbers
    kwargs = {"steps": int(args[args.index("--steps") + 1])} if "--steps" in args else {}
    kwargs.update({"rule": args[args.index("--rule") + 1]} if "--rule" in args else {})
    kwargs.update({"tol": float(args[args.index("--tol") + 1])} if "--tol" in args else {})
    res = aa.score(examples="0:2", **kwargs)
    for r, a in zip(res, stored):
        assert np.array_equal(r.attribution, a)
        assert (r.nodes == steps).all() if tol is None else all(n == 3 or (n - 5) % 4 == 0 for n in r.nodes.tolist())


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
    (["--tol", "1e-3", "--rule", "left"],
     "Error: --tol places its own nodes; it does not go with --rule left (give either --tol or a fixed rule)"),
    (["--tol", "0.1", "--steps", "20"],
     "Error: --tol places its own nodes; it does not go with --steps 20 (give either --tol or a fixed rule)"),
    (["--tol", "0"], "Error: --tol must be a finite number > 0, got 0.0"),
    (["--tol", "inf"], "Error: --tol must be a finite number > 0, got inf"),
    (["--tol", "nan"], "Error: --tol must be a finite number > 0, got nan"),
    (["--tol", "1e-3", "--max-nodes", "2"], "Error: --max-nodes must be at least 5 (the first interval's nodes), got 2"),
])
def test_score_tol_refuses_bad_options_with_one_line(tmp_path, args, message):
    from typer.testing import CliRunner

    from attattr_cli.cli import app

    result = CliRunner().invoke(app, ["score", "--out", str(tmp_path / "x.h5"), "--examples", "0:1", *args])
    assert result.exit_code != 0
    assert [line for line in result.stderr.splitlines() if line.strip()] == [message]
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("kind", ["bart", "gpt2"])
def test_tol_on_every_family_agrees_with_a_converged_fixed_rule(tokenizer, kind):
    """Encoder-decoder families (encoder, decoder, cross) and a causal LM: each layer's map
    under --tol is within its tolerance of Gauss-Legendre with 48 nodes, F(0) is the same."""
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
    fixed = Scorer(loaded, ScoreOptions(rule="gauss", steps=48, dtype="float64", lm=lm)).score(example)
    for name, fam in result.families.items():
        assert (fam.error <= 1e-3).all() and not fam.capped.any()
        assert (fam.status == adaptive.CONVERGED).all()
        ref = fixed.families[name]
        for k, layer in enumerate(fam.layers):
            assert np.abs(fam.head_max[k] - ref.head_max[k]).max() <= 2e-3 * np.abs(ref.head_max[k]).max()
            assert fam.f_baseline[k] == pytest.approx(ref.f_baseline[k], rel=1e-12)
            assert abs(fam.residual[k]) <= 1e-3 * max(abs(fixed.f_full - ref.f_baseline[k]), 1e-3)


def test_an_unconverged_store_says_so_in_info_report_view_and_the_analyses(tmp_path):
    """A node cap too small for the tolerance: the store flags those example-layers, `info`
    lists them with why, the report flags the examples, an analysis reading the store says
    how many it used."""
    import json

    from typer.testing import CliRunner

    from attattr_cli import convergence
    from attattr_cli.cli import app
    from attattr_cli.store import Store

    runner = CliRunner()
    out = tmp_path / "capped.h5"
    assert runner.invoke(app, ["score", "--out", str(out), "--examples", "0:3", "--tol", "1e-4", "--max-nodes", "9",
                               "-q"]).exit_code == 0
    with Store(out) as s:
        states = np.concatenate([s.get(i).convergence for i in s.indices()])
        assert s.get(0).convergence_tol == 1e-4
        assert s.unconverged(s.indices()) == [i for i in s.indices() if convergence.unconverged(s.get(i).convergence).any()]
    assert (states == convergence.CAP_HIT).any()
    summary = json.loads(runner.invoke(app, ["info", str(out), "--json"]).stdout)["families"]["self"]
    assert summary["unconverged"] == int((states != convergence.CONVERGED).sum()) > 0
    assert summary["convergence"]["node cap hit"] == int((states == convergence.CAP_HIT).sum())
    shown = runner.invoke(app, ["info", str(out)], env={"COLUMNS": "400"}).stdout
    assert "NOT converged" in shown and "node cap hit" in shown
    first = summary["unconverged_at"][0]
    assert f"{first['example']}/{first['layer']}" in shown

    report = tmp_path / "r.html"
    assert runner.invoke(app, ["report", str(out), "-o", str(report)]).exit_code == 0
    page = report.read_text()
    assert '"unconverged"' in page and "not converged" in page
    result = runner.invoke(app, ["importance", str(out), "--out", str(tmp_path / "imp.h5"), "-q"])
    assert result.exit_code == 0, result.output
    n = len({w["example"] for w in summary["unconverged_at"]})
    assert f"note: {n} of the 3 examples used" in result.stderr

    fine = tmp_path / "fine.h5"  # the same examples at the default: all converged
    assert runner.invoke(app, ["score", "--out", str(fine), "--examples", "0:3", "-q"]).exit_code == 0
    summary = json.loads(runner.invoke(app, ["info", str(fine), "--json"]).stdout)["families"]["self"]
    assert summary["unconverged"] == 0 and summary["convergence"] == {"converged": 9}
    assert "all 9 example-layers converged" in runner.invoke(app, ["info", str(fine)], env={"COLUMNS": "400"}).stdout


def test_a_fixed_rule_store_is_judged_and_an_older_store_is_unchecked(tmp_path):
    from typer.testing import CliRunner

    import h5py

    from attattr_cli import convergence
    from attattr_cli.cli import app
    from attattr_cli.store import Store

    runner = CliRunner()
    out = tmp_path / "fixed.h5"
    assert runner.invoke(app, ["score", "--out", str(out), "--examples", "0:6", "--rule", "right", "--steps", "4",
                               "-q"]).exit_code == 0
    with Store(out) as s:
        for i in s.indices():
            e = s.get(i)
            for k in range(len(e.layers)):  # judged at the default's tolerance, from its estimate and residual
                state = int(e.convergence[k])
                assert state in (convergence.CONVERGED, convergence.ESTIMATE, convergence.RESIDUAL)
                if e.error_estimate[k] > 0.1 and state != convergence.RESIDUAL:
                    assert state == convergence.ESTIMATE
                if state == convergence.CONVERGED:
                    assert e.error_estimate[k] <= 0.1
        assert e.convergence_tol == 0.1
        states = np.concatenate([s.get(i).convergence for i in s.indices()])
    assert (states != convergence.CONVERGED).any()  # 4 right-rule nodes are not enough everywhere here
    with h5py.File(out, "a") as f:  # as a store written before schema 1.3
        for g in f["examples"].values():
            del g["convergence"]
    with Store(out) as s:
        assert (s.get(0).convergence == convergence.UNCHECKED).all() and s.unconverged(s.indices()) == []
    assert "not checked" in runner.invoke(app, ["info", str(out)], env={"COLUMNS": "400"}).stdout


def test_the_api_says_which_layers_did_not_converge():
    import attattr_cli.api as aa

    capped = aa.score(examples="0:3", tol=1e-4, max_nodes=9)
    assert any(not r.converged for r in capped)
    for r in capped:
        assert set(r.unconverged_layers.values()) <= {"node cap hit", "residual disagrees"}
        assert r.converged == (not r.unconverged_layers)
    assert all(r.converged for r in aa.score(examples="0:3"))


_SPIKES = [(0.36, 10.0), (0.40, -8.0), (0.45, 30.0), (0.46, 25.0)]  # (alpha, height), width 0.004 each


def _spikes(a):  # a smooth slope with narrow spikes in the middle of the path (as SmolLM2's layer 0 has)
    return 0.5 + 0.3 * a + sum(h * np.exp(-((a - c) / 0.004) ** 2) for c, h in _SPIKES)


def _spikes_integral(a):
    erf = np.vectorize(math.erf)
    return 0.5 * a + 0.15 * a * a + sum(h * 0.004 * math.sqrt(math.pi) / 2 * (erf((a - c) / 0.004) - math.erf(-c / 0.004))
                                        for c, h in _SPIKES)


def test_a_smooth_integrand_ends_at_the_three_node_start_and_a_rough_one_goes_on():
    """The first try is alpha = 0, 1/2 and the free alpha = 1 (two evaluations); where its
    estimate and residual agree it ends there, else the whole path's five nodes follow (two
    more) and the refinement goes on from them. ``coarse=False`` starts from the five."""
    line = _Field(lambda a: 1.0 + 0.2 * a, lambda a: a + 0.1 * a * a)
    res = line.run(1e-3)
    assert res.status == adaptive.CONVERGED and res.nodes == 3 and res.evaluated == 2
    assert sorted(res.weights) == [0.0, 0.5, 1.0] and line.true_error(res, 1.1) < 1e-12
    one = line.evaluate(torch.ones(1, dtype=torch.float64))[0][0]
    five = adaptive.integrate(line.evaluate, line.measure, 1e-3, 129, {adaptive.ONE: one},
                              {adaptive.ONE: float(line.big_f(np.ones(1))[0])},
                              coarse=False)
    assert five.nodes == 5 and five.evaluated == 4 and five.status == adaptive.CONVERGED
    field = _Field(*FUNCTIONS["runge"])
    res = field.run(1e-2)
    assert res.nodes > 5 and [len(c) for c in field.calls[:2]] == [2, 2]  # 0 and 1/2, then 0.146 and 0.854
    assert field.true_error(res, _exact("runge")) <= res.error <= 1e-2


def test_the_three_node_start_reads_simpsons_error_from_the_two_residuals(monkeypatch):
    """The start's estimate is the midpoint rule's error, max |Attr(Simpson - midpoint)|, times
    min(1, max(8 q, 1/2)), q = |Simpson's residual| / |the midpoint rule's| on dF/dalpha (their
    exact errors on the scalar). On exp(3 alpha) Simpson's error is 7.5 % of the midpoint
    rule's: the start ends at --tol 0.2 with an estimate still above the true error, where the
    midpoint rule's error alone (0.31) sends it on to five nodes."""
    assert adaptive.start_factor(0.01, 1.0, 1e-9) == adaptive.START_FLOOR
    assert adaptive.start_factor(0.1, 1.0, 1e-9) == pytest.approx(adaptive.START_RATIO * 0.1)
    assert adaptive.start_factor(0.5, 1.0, 1e-9) == 1.0  # never above the midpoint rule's error
    assert adaptive.start_factor(0.0, 1e-12, 1e-9) == 1.0  # a residual at the rounding says nothing
    field, exact = _Field(*FUNCTIONS["exp"]), _exact("exp")
    res = field.run(0.2)
    assert res.nodes == 3 and res.evaluated == 2 and res.status == adaptive.CONVERGED
    assert field.true_error(res, exact) <= res.error <= 0.2
    monkeypatch.setattr(adaptive, "START_FLOOR", 1.0)  # the midpoint rule's error alone
    res = field.run(0.2)
    assert res.nodes == 5 and res.status == adaptive.CONVERGED and field.true_error(res, exact) <= res.error


def test_narrow_features_in_the_middle_converge_under_the_cap():
    """Spikes of width 0.004 near alpha = 0.4: the leaves holding the most error are split (not
    every leaf holding more than its width's share), and the nodes are densest there."""
    field = _Field(_spikes, _spikes_integral)
    exact = float(_spikes_integral(np.ones(1))[0])
    for tol in (1e-1, 3e-2):
        res = field.run(tol)
        assert res.status == adaptive.CONVERGED and not res.capped and res.nodes < 129, (tol, res.nodes)
        assert field.true_error(res, exact) <= res.error <= tol
        alphas = np.array(sorted(adaptive.alpha_of(k) for k in res.weights))
        narrowest = int(np.argmin(np.diff(alphas)))
        assert 0.34 < alphas[narrowest] < 0.48  # the nodes are densest where the integrand moves


def test_every_integral_starts_from_three_nodes(tokenizer, loaded_factory):
    """A decoder scoring one short prompt starts from the three nodes, with its layers in sweeps
    (engine/sweep.py) or one pass per layer, as an encoder classifier's examples in a group
    do: where every node is rows of a shared pass, the start's two nodes cost half the five's."""
    from attattr_cli.data.types import Example
    from attattr_cli.engine import grouped
    from attattr_cli.models.loading import prepare
    from conftest import build_model

    lm = Scorer(prepare(build_model("llama", lm=True), tokenizer, "tiny-llama", lm=True), ScoreOptions(tol=0.5, lm=True))
    assert not grouped.groupable(lm)
    prompt = Example(0, "w1 w2 w3 w4")
    swept = lm.score(prompt).families["self"].nodes.tolist()
    lm.sweep = False
    layered = lm.score(prompt).families["self"].nodes.tolist()
    assert 3 in swept and swept == layered
    bert = Scorer(loaded_factory("bert"), ScoreOptions(tol=0.5))
    assert grouped.groupable(bert) and 3 in bert.score(Example(0, "w1 w2", "w3")).families["self"].nodes.tolist()


def _spike(c, h, w=0.01):
    f = lambda a: h * np.exp(-((a - c) / w) ** 2)  # noqa: E731
    erf = np.vectorize(math.erf)
    return f, lambda a: h * w * math.sqrt(math.pi) / 2 * (erf((a - c) / w) - math.erf(-c / w))


def test_the_leaves_estimates_add_entry_by_entry_not_worst_entry_to_worst_entry():
    """Two entries of a map, each with a spike of its own (alpha = 0.2 and 0.7): the leaves
    near one spike err in one entry, those near the other in the other. Summing every leaf's
    worst entry adds the two entries' errors; summing the leaves' maps entry by entry
    (``spread``, max over entries of sum_I |Attr(upper_I - lower_I)|) does not, and is still
    a bound: the refinement ends with fewer nodes, its estimate above the true error."""
    (f1, i1), (f2, i2) = _spike(0.2, 2.0, 0.05), _spike(0.7, 2.0, 0.05)

    def evaluate(alphas):
        a = alphas.numpy()
        g = torch.from_numpy(np.stack([0.5 + f1(a), 0.5 + f2(a)], axis=1))
        return g, torch.from_numpy(0.5 * a + i1(a) + 0.5 * a + i2(a))

    def measure(g):
        return float(g.abs().max()), float(g.abs().sum()), float(g.sum())

    exact = torch.tensor([0.5 + float(i1(np.ones(1))[0]), 0.5 + float(i2(np.ones(1))[0])], dtype=torch.float64)
    one, f_one = evaluate(torch.ones(1, dtype=torch.float64))
    runs = {}
    for name, spread in (("worst entries", None), ("entry by entry", lambda g: g.abs().sum(0).amax())):
        res = adaptive.integrate(evaluate, measure, 1e-3, 257, {adaptive.ONE: one[0]}, {adaptive.ONE: float(f_one[0])},
                                 spread=spread)
        true = float((res.g - exact).abs().max() / exact.abs().max())
        assert res.status == adaptive.CONVERGED and true <= res.error <= 1e-3, (name, true, res.error)
        runs[name] = res.nodes
    assert runs["entry by entry"] < runs["worst entries"], runs  # 61 nodes against 73


def test_the_leaves_maps_are_added_in_chunks_with_the_same_sum(monkeypatch):
    """map_spread makes and adds the leaves' maps a chunk at a time (bounded memory on long
    inputs); the chunks change nothing but the order of the float64 sum."""
    from attattr_cli.engine import layer_integral

    gen = torch.Generator().manual_seed(0)
    a = torch.rand(4, 7, 7, generator=gen)
    v, g = torch.randn(4, 7, 3, generator=gen), torch.randn(9, 4, 7, 3, generator=gen)
    want = (a * (g @ v.transpose(-1, -2))).abs().sum(0, dtype=torch.float64).amax()
    assert float(layer_integral.map_spread(a, v, g)) == pytest.approx(float(want), rel=1e-12)
    monkeypatch.setattr(layer_integral, "SPREAD_CHUNK", 2 * a.numel())  # five chunks of two leaves and one
    assert float(layer_integral.map_spread(a, v, g)) == pytest.approx(float(want), rel=1e-12)


@pytest.mark.parametrize("options", [dict(steps=4), dict(tol=0.1)], ids=["fixed", "tol"])
def test_every_path_integrates_through_the_one_integral(tokenizer, loaded_factory, monkeypatch, options):
    """One example's layers (one pass per layer, or sweeps), a group of examples, a generation's
    steps (either way) and the circuit methods' pattern path all add their nodes up in one
    place (engine/rows.py's add_rows, for engine/layer_integral.py's node_sum) and refine to
    --tol in one loop (adaptive.Refinement.run, for layer_integral.to_tol)."""
    from attattr_cli.analysis.circuits.pattern import pattern_attribution
    from attattr_cli.analysis.circuits.task import CircuitTask, Context
    from attattr_cli.data.pairs import Pair
    from attattr_cli.data.types import Example
    from attattr_cli.engine import grouped, layer_integral, run
    from attattr_cli.models.loading import prepare
    from conftest import build_model

    seen = []
    add_rows, refine = layer_integral.add_rows, adaptive.Refinement.run
    monkeypatch.setattr(layer_integral, "add_rows", lambda *a, **k: seen.append("fixed") or add_rows(*a, **k))
    monkeypatch.setattr(adaptive.Refinement, "run", lambda self, *a, **k: seen.append("tol") or refine(self, *a, **k))
    want = "tol" if "tol" in options else "fixed"

    def integrated(score) -> bool:
        seen.clear()
        score()
        return want in seen

    bert = Scorer(loaded_factory("bert"), ScoreOptions(**options))
    examples = [Example(i, t) for i, t in enumerate(["w1 w2 w3", "w4 w5", "w6 w7 w8 w9"])]
    lm = prepare(build_model("llama", lm=True, layers=2), tokenizer, "tiny-llama", lm=True)
    for swept in (True, False):
        bert.sweep = swept
        assert integrated(lambda: bert.score(examples[0]))
        gen = run.scorer_for(lm, ScoreOptions(lm=True, generate=2, **options))
        gen.sweep = swept
        assert integrated(lambda: gen.score(Example(0, "w1 w2 w3")))
    assert integrated(lambda: grouped.score_group(bert, examples, [bert.encode(e) for e in examples]))
    if want == "fixed":  # (a fixed Gauss rule)
        pairs = [Pair(0, "w1 w2 w3 w4 w1", "w5 w6 w7 w8 w9", ("w2",), ("w1",))]
        assert integrated(lambda: pattern_attribution(Context(CircuitTask(lm, pairs)), False, "sum"))
