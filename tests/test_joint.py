"""The joint path (engine/joint.py, docs/method.md 1.6): every layer's attention scaled
together, checked against integrated gradients over explicit attention gates computed by its
definition (tests/slow_reference.py), completeness for the whole model, the paper's path when
one layer is scored, and the options around it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import attattr_cli as aa
from attattr_cli.engine.integrate import nodes
from attattr_cli.errors import OptionError
from attattr_cli.models.loading import prepare
from conftest import build_model, run_cli
from slow_reference import slow_joint_attribution

PROMPT = "w1 w2 w3 w4 w5 w6"
ANSWER = "w7 w8"


@pytest.fixture
def lm(tokenizer):
    model = build_model("llama", torch.float64, num_labels=2, layers=3, lm=True)
    return aa.Model(prepare(model, tokenizer, "tiny-llama", lm=True))


def _joint_log_prob(res):
    """F of the result: the answer's joint log-probability, from the logits at its positions."""
    positions, targets = res.meta["lm"]["positions"], res.meta["lm"]["target_ids"]

    def f(logits):
        lp = torch.log_softmax(logits[0], -1)
        return sum(lp[p, t] for p, t in zip(positions, targets)).view(1)

    return f


def test_joint_equals_gate_integrated_gradients(lm):
    res = aa.score(lm, prompts=[PROMPT], continuation=ANSWER, output="logprob", path="joint", keep="maps",
                   rule="gauss", steps=6, dtype="float64")[0]
    alphas, weights = nodes("gauss", 6)
    ref, f0, f1 = slow_joint_attribution(lm.loaded.model, {"input_ids": torch.tensor([list(res.input_ids)])},
                                         alphas.tolist(), weights.tolist(), _joint_log_prob(res),
                                         more_inputs={"use_cache": False})
    got = np.asarray(res.attribution, np.float64)
    assert got.shape[0] == 3
    for li in range(3):
        np.testing.assert_allclose(got[li], ref[li].numpy(), rtol=1e-7, atol=1e-10)
    assert res.meta["path"]["name"] == "joint"
    assert res.meta["path"]["f_zero"] == pytest.approx(f0, rel=1e-9)
    assert res.f_full == pytest.approx(f1, rel=1e-9)
    # per-head maxima come from the whole maps; per-layer residuals do not exist on this path
    np.testing.assert_allclose(res.head_max, got.reshape(3, got.shape[1], -1).max(-1), rtol=1e-6)
    assert np.isnan(res.residual).all() and not res.nonfinite


def test_joint_completeness_for_the_whole_model(lm):
    res = aa.score(lm, prompts=[PROMPT], continuation=ANSWER, output="logprob", path="joint", keep="maps",
                   tol=1e-4, dtype="float64")[0]
    path = res.meta["path"]
    effect = res.f_full - path["f_zero"]
    total = float(np.asarray(res.attribution, np.float64).sum())
    assert path["converged"] and abs(effect) > 1e-3
    assert total == pytest.approx(effect, rel=2e-4)
    assert abs(path["residual"]) <= 1e-4 * abs(effect) + 1e-12
    assert (np.asarray(res.convergence) == 0).all()
    # the kept source scores are the maps' key columns summed
    src = aa.score(lm, prompts=["w1 w2 w3\n\nw4 w5 w6"], continuation=ANSWER, output="logprob", path="joint",
                   sources="paragraphs", tol=1e-4, dtype="float64")[0]
    maps = aa.score(lm, prompts=["w1 w2 w3\n\nw4 w5 w6"], continuation=ANSWER, output="logprob", path="joint",
                    keep="maps", tol=1e-4, dtype="float64")[0]
    assert src.keep == "sources" and src.attribution is None
    np.testing.assert_allclose(src.key_sum, np.asarray(maps.attribution, np.float64).sum((1, 2)), rtol=1e-5,
                               atol=1e-9)


def test_one_scored_layer_is_the_papers_path(lm):
    kw = dict(prompts=[PROMPT], continuation=ANSWER, keep="maps", rule="gauss", steps=5, dtype="float64",
              layers=[1])
    joint = aa.score(lm, path="joint", **kw)[0]
    layer = aa.score(lm, **kw)[0]
    np.testing.assert_allclose(joint.attribution, layer.attribution, rtol=1e-6, atol=1e-12)  # float32 results
    np.testing.assert_allclose(joint.meta["path"]["f_zero"], layer.f_baseline[0], rtol=1e-9)


def test_joint_costs_one_pass_per_node_and_options(lm):
    res = aa.score(lm, prompts=[PROMPT], continuation=ANSWER, path="joint", keep="sum", rule="gauss", steps=4,
                   dtype="float64")[0]
    assert res.meta["path"]["passes"] == 1  # 4 nodes and the two ends of a short input in one pass
    assert res.head_sum is not None and np.isnan(res.head_max).all()
    with pytest.raises(OptionError, match="unknown (--)?path"):
        aa.score(lm, prompts=[PROMPT], path="diagonal")
    with pytest.raises(OptionError, match="not (--)?generate"):
        aa.score(lm, prompts=[PROMPT], path="joint", generate=2)
    with pytest.raises(OptionError, match="not (--)?keep none"):
        aa.score(lm, prompts=[PROMPT], path="joint", keep="none")


def test_cli_path_joint(tokenizer, tmp_path):
    model = build_model("llama", torch.float32, num_labels=2, layers=2, lm=True)
    model.save_pretrained(tmp_path / "m")
    tokenizer.save_pretrained(tmp_path / "m")
    out = tmp_path / "s.h5"
    r = run_cli("score", "--lm", "--model", str(tmp_path / "m"), "--prompt", PROMPT, "--continuation", ANSWER,
                "--path", "joint", "--steps", "4", "--out", str(out))
    assert r.exit_code == 0, r.output
    store = aa.open_store(str(out))
    assert store[0].meta["path"]["name"] == "joint" and store.provenance["options"]["path"] == "joint"
    r = run_cli("score", "--lm", "--model", str(tmp_path / "m"), "--prompt", PROMPT, "--path", "nope",
                "--out", str(tmp_path / "t.h5"))
    assert r.exit_code == 2 and "unknown --path" in r.output and not (tmp_path / "t.h5").exists()
