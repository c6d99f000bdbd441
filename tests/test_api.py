"""The public Python API: the same numbers as the CLI, the caller's model left as it was,
typed errors that name arguments, a docstring on everything public."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

import attattr_cli as aa
from attattr_cli.cli import app
from attattr_cli.errors import AttattrError, ModelError, OptionError, StoreError
from conftest import WORDS, build_model

runner = CliRunner()
REPO = Path(__file__).resolve().parent.parent


def _cli(*args):
    r = runner.invoke(app, [str(a) for a in args])
    assert r.exit_code == 0, r.output
    return r


@pytest.fixture(scope="module")
def builtin():
    return aa.load_model()


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory):
    """Three built-in examples scored by the CLI."""
    out = tmp_path_factory.mktemp("cli") / "s.h5"
    _cli("score", "--out", out, "--examples", "0:3", "--steps", "4", "-q")
    return out


# ----------------------------------------------------------------------------- import


def test_import_is_cheap_and_exports_everything():
    code = "import sys, attattr_cli as aa; print('torch' in sys.modules); print(sorted(aa.__all__))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO,
                       env={"PYTHONPATH": str(REPO), "PATH": ""})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == "False"  # no torch until a function is used
    for name in aa.__all__:
        assert getattr(aa, name) is not None
    with pytest.raises(AttributeError):
        aa.no_such_function  # noqa: B018


def test_every_public_name_has_a_docstring():
    for name in aa.__all__:
        if name == "__version__":
            continue
        obj = getattr(aa, name)
        assert inspect.getdoc(obj), name
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                if attr.startswith("_") or not (inspect.isfunction(member) or isinstance(member, property)):
                    continue
                assert inspect.getdoc(member), f"{name}.{attr}"


# ----------------------------------------------------------------------------- API == CLI


def test_score_matches_the_cli(builtin, cli_store):
    res = aa.score(builtin, examples="0:3", steps=4)
    with aa.open_store(cli_store) as store:
        assert len(res) == len(store) == 3
        for a, b in zip(res, store):
            assert a.index == b.index and a.tokens == b.tokens
            for name in ("attribution", "attention", "residual", "head_max", "probs"):
                np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
            assert a.prediction == b.prediction == builtin.label_names[a.pred]


def test_score_in_memory_pairs_match_the_store(builtin, cli_store):
    with aa.open_store(cli_store) as store:
        rows = [store[i] for i in store.indices]
    res = aa.score(builtin, [r.text for r in rows], steps=4)
    for a, b in zip(res, rows):
        assert a.text == b.text and a.tokens == b.tokens
        np.testing.assert_array_equal(a.attribution, b.attribution)
        np.testing.assert_array_equal(a.residual, b.residual)


def test_score_into_a_store_resumes(builtin, tmp_path):
    out = tmp_path / "s.h5"
    rep = aa.score(builtin, [("a b", "c"), "d e f"], out=out, steps=2)
    assert rep.scored == 2 and rep.skipped == 0 and Path(rep.out) == out
    rep = aa.score(builtin, [("a b", "c"), "d e f"], out=out, steps=2)
    assert rep.scored == 0 and rep.skipped == 2
    with pytest.raises(StoreError, match="made from other data"):  # other inputs: another run, refused
        aa.score(builtin, [("a b", "c"), "d e f", "g"], out=out, steps=2)
    with aa.open_store(out) as s:
        assert s.indices == [0, 1] and s[1].text == "d e f" and s[0].text == ("a b", "c")


def test_importance_matches_the_cli(builtin, cli_store, tmp_path):
    _cli("importance", cli_store, "--methods", "attr,attention", "--out", tmp_path / "imp.h5", "-q")
    from attattr_cli.analysis.importance import read

    cli = read(tmp_path / "imp.h5")
    api = aa.importance(cli_store)
    for name in ("attr", "attention"):
        np.testing.assert_array_equal(api[name], cli.tables[name].values)
    _cli("importance", "--methods", "taylor", "--examples", "0:8", "--out", tmp_path / "t.h5", "-q")
    taylor = aa.importance(model=builtin, methods=["taylor"], examples="0:8")
    np.testing.assert_allclose(taylor["taylor"], read(tmp_path / "t.h5").tables["taylor"].values, rtol=1e-6)
    # the attr table is E_x max Attr_h: the mean of the examples' head maxima
    with aa.open_store(cli_store) as s:
        np.testing.assert_allclose(api["attr"], np.mean([e.head_max for e in s], axis=0), rtol=1e-6)
    in_memory = aa.importance(aa.score(builtin, examples="0:3", steps=4), methods="attr")
    np.testing.assert_array_equal(in_memory["attr"], api["attr"])
    assert api.ranking("attr")[0] == tuple(np.unravel_index(np.argmax(api["attr"]), api["attr"].shape))


def test_triggers_and_attack_match_the_cli(builtin, cli_store, tmp_path):
    _cli("triggers", cli_store, "--out", tmp_path / "t.json", "-q")
    cli = json.loads((tmp_path / "t.json").read_text())
    api = aa.triggers(cli_store)
    assert [t["tokens"] for t in api.to_dict()["triggers"]] == [t["tokens"] for t in cli["triggers"]]
    assert [t["count"] for t in api.to_dict()["triggers"]] == [t["count"] for t in cli["triggers"]]
    # from results in memory: the same triggers
    in_memory = aa.triggers(aa.score(builtin, examples="0:3", steps=4))
    assert [t.tokens for t in in_memory.triggers] == [t.tokens for t in api.triggers]

    r = _cli("attack", "--triggers", tmp_path / "t.json", "--examples", "0:30", "--top-k", "2", "-q")
    cli_attack = json.loads(r.stdout)
    res = aa.attack(builtin, api, examples="0:30", top_k=2)
    assert res.table == cli_attack["table"] and res.before == cli_attack["overall_before"]
    assert [r["flipped"] for r in res.rows] == [r["flipped"] for r in cli_attack["triggers"] + cli_attack["controls"]]


def test_prune_and_predict_agree(builtin, cli_store, tmp_path):
    imp = aa.importance(cli_store)
    res = aa.prune(builtin, imp, examples="0:40", rates=[0, 0.5])
    c = res.curves
    assert c["rates"] == [0, 0.5] and c["methods"]["attr"]["accuracy"][0] == c["baseline"]["accuracy"]
    # masking the half of the heads the attr table ranks lowest, by hand, gives the curve's point
    from attattr_cli.analysis.prune import mask_at

    mask = mask_at(imp["attr"], 0.5).numpy()
    assert mask.sum() == mask.size // 2
    p = aa.predict(builtin, examples="0:40", mask=mask)
    assert p.accuracy == pytest.approx(c["methods"]["attr"]["accuracy"][1])
    assert aa.predict(builtin, examples="0:40").accuracy == pytest.approx(c["baseline"]["accuracy"])
    res = aa.prune(builtin, imp, examples="0:10", rates="0,1", out=tmp_path / "c.json")
    assert json.loads((tmp_path / "c.json").read_text())["curves"]["rates"] == [0, 1]
    assert res.to_dict()["curves"] == json.loads(res.to_json())["curves"]


def test_store_view_and_tree_match_the_cli(cli_store):
    with aa.open_store(cli_store) as s:
        assert len(s) == 3 and s.indices == [0, 1, 2] and [e.index for e in s] == [0, 1, 2]
        assert s.info()["examples"] == 3 and s.provenance["task"] == "synthetic"
        assert 1 in s and 7 not in s
        ex = s[2]
    t = aa.tree(ex, tau=0.4)
    r = _cli("tree", cli_store, "--example", 2, "--format", "json", "-q")
    assert json.loads(t.to_json()) == json.loads(r.stdout)
    assert t.to_dot().startswith("digraph")
    assert t.edges and all(t.graph.has_edge(a, b) for a, b, _ in t.edges)
    assert t.top == t.graph.graph["top"]
    dot = t.save(Path(cli_store).parent / "t.dot")
    assert dot.read_text() == t.to_dot()


def test_attribution_conveniences(cli_store):
    with aa.open_store(cli_store) as s:
        e = s[0]
    assert e.gold_label == s.label_names[e.gold] and e.target_label == e.prediction  # target: predicted
    assert np.allclose(e.probabilities.sum(), 1, atol=1e-5)
    top = e.top(5)
    a = np.asarray(e.attribution)
    assert [r.value for r in top] == sorted((r.value for r in top), reverse=True)
    assert top[0].value == pytest.approx(float(a.max()))
    for r in top:
        assert a[e.layers.index(r.layer), r.head, r.query, r.key] == pytest.approx(r.value)
        assert r.query_token == e.tokens[r.query] and r.key_token == e.tokens[r.key]
    np.testing.assert_allclose(e.token_importance(), a.astype(np.float64).sum(axis=(0, 1, 2)), rtol=1e-6)
    assert e.text == (e.text_a, e.text_b)


def test_results_render_themselves(cli_store, tmp_path, monkeypatch):
    """In a notebook an example shows its view (_repr_html_, show, save) and colours its tokens;
    the tree carries the prediction into its drawing."""
    with aa.open_store(cli_store) as s:
        e = s[1]
    html = e._repr_html_()
    assert "<script" in html and all(t in html for t in set(e.tokens))
    displayed = []
    ipython = types.ModuleType("IPython")
    ipython.display = types.ModuleType("IPython.display")
    ipython.display.display = displayed.append
    with monkeypatch.context() as mp:  # a notebook's display, for this call only
        mp.setitem(sys.modules, "IPython", ipython)
        mp.setitem(sys.modules, "IPython.display", ipython.display)
        assert e.show(layers=[0]) is None  # displayed once in a notebook, nothing returned to show twice
    shown = displayed[0]._repr_html_()
    assert "<script" in shown and all(t in shown for t in set(e.tokens))
    e.save(tmp_path / "v.svg", layers=[0])
    svg = (tmp_path / "v.svg").read_text()
    assert svg.lstrip().startswith(("<?xml", "<svg")) and e.tokens[1] in svg
    e.save(tmp_path / "v.html")
    assert (tmp_path / "v.html").read_text().lstrip().lower().startswith("<!doctype html")
    colours = e.highlight()
    assert colours.count("<span") >= len(e.tokens)
    with pytest.raises(OptionError):
        e.save(tmp_path / "v.bmp")
    assert not (tmp_path / "v.bmp").exists()
    t = aa.tree(e)
    assert e.prediction in t.prediction and e.prediction in t.to_dot()


def test_faithfulness_merge_and_progress(builtin, tmp_path):
    seen = []
    a = aa.score(builtin, examples="0:2", out=tmp_path / "a.h5", steps=2, progress=lambda d, t, s: seen.append((d, t)))
    assert seen and seen[-1][0] == seen[-1][1]
    aa.score(builtin, examples="2:3", out=tmp_path / "b.h5", steps=2)
    merged = aa.merge([a.out, tmp_path / "b.h5"], tmp_path / "m.h5")
    assert merged["added"] == 3
    with aa.open_store(tmp_path / "m.h5") as s:
        assert s.indices == [0, 1, 2]
    rep = aa.faithfulness(tmp_path / "m.h5", methods="attention_last,attr", permutations=0)
    assert set(rep.methods) == {"attention_last", "attr"} and rep.report["examples"] == 3
    assert {r["method"] for r in rep.rows} == {"attention_last", "attr"}


def test_finetune_and_import_2021(tmp_path):
    rep = aa.finetune(out=tmp_path / "ft", epochs=0.05, max_examples=64, batch_size=16)
    assert rep.train_examples == 64 and (tmp_path / "ft" / "config.json").exists()
    m = aa.load_model(tmp_path / "ft")
    assert m.label_names == aa.load_model().label_names
    tokens = ["[CLS]", "the", "cat", "[SEP]", "a", "pet", "[SEP]"]
    (tmp_path / "tok.json").write_text(json.dumps([{"index": 0, "tokens": tokens, "pred": "entailment",
                                                    "golden": "entailment", "pred_logits": [[-1.0, 2.5, 0.1]]}]))
    attr = np.round(np.random.default_rng(0).normal(size=(2, 2, 7, 7)), 4)
    (tmp_path / "attr.json").write_text("".join(json.dumps(x.tolist()) + "\n" for x in attr))
    aa.import_2021(tmp_path / "attr.json", tmp_path / "tok.json", tmp_path / "imp.h5")
    with aa.open_store(tmp_path / "imp.h5") as s:
        np.testing.assert_allclose(s[0].attribution, attr, rtol=1e-6)


# ----------------------------------------------------------------------------- the caller's model


def _state(model):
    return {
        "params": {n: p.detach().clone() for n, p in model.named_parameters()},
        "training": {n: m.training for n, m in model.named_modules()},
        "grad": {n: p.requires_grad for n, p in model.named_parameters()},
        "dtype": {n: p.dtype for n, p in model.named_parameters()},
        "attn": model.config._attn_implementation,
        "forwards": {n for n, m in model.named_modules() if "forward" in m.__dict__},
    }


def _same(model, before):
    now = _state(model)
    assert now["training"] == before["training"]
    assert now["grad"] == before["grad"]
    assert now["dtype"] == before["dtype"]
    assert now["attn"] == before["attn"]
    assert now["forwards"] == before["forwards"]
    for n, p in before["params"].items():
        assert torch.equal(now["params"][n], p), n


def test_an_in_memory_model_is_left_as_it_was(tokenizer, monkeypatch):
    model = build_model("bert")
    model.train()
    model.bert.embeddings.requires_grad_(False)  # a mix of frozen and trainable parameters
    before = _state(model)
    pair = (model, tokenizer)
    inputs = [(" ".join(WORDS[:4]), " ".join(WORDS[4:7])), " ".join(WORDS[7:12])]
    res = aa.score(pair, inputs, steps=2, dtype="float64")
    _same(model, before)
    assert res[0].attribution.shape[:2] == (3, model.config.num_attention_heads)
    aa.importance(model=pair, inputs=inputs, methods="taylor")
    _same(model, before)
    mask = np.ones((3, model.config.num_attention_heads))
    mask[0, 0] = 0
    aa.predict(pair, inputs, mask=mask)
    _same(model, before)
    tr = aa.triggers(model=pair, inputs=inputs, steps=2)
    _same(model, before)
    aa.attack(pair, tr, inputs=inputs, top_k=1)
    _same(model, before)
    # an error after attattr switched the model to float64 and eval mode: still put back
    from attattr_cli.engine import run

    def boom(self, result):
        raise RuntimeError("disk full")

    monkeypatch.setattr(run.StoreWriter, "write", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        aa.score(pair, inputs, steps=2, dtype="float64")
    _same(model, before)


# ----------------------------------------------------------------------------- errors


def test_errors_are_typed_and_name_arguments(builtin, cli_store):
    cases = [
        (lambda: aa.score(builtin, ["x"], steps=0), OptionError, "steps must be at least 1"),
        (lambda: aa.score(builtin, ["x"], top_k=0), OptionError, "top_k must be at least 1"),
        (lambda: aa.score(builtin, ["x"], keep="all"), OptionError, "unknown keep 'all'"),
        (lambda: aa.score(builtin, []), OptionError, "inputs is empty"),
        (lambda: aa.score(builtin, [3]), OptionError, "inputs[0] must be"),
        (lambda: aa.load_model(42), ModelError, "source must be"),
        (lambda: aa.score(builtin, ["x"], target_token="w1"), OptionError, "target_token, continuation and position"),
        (lambda: aa.score(builtin, ["x"], rule="simpson"), OptionError, "unknown rule 'simpson'"),
        (lambda: aa.score(builtin, ["x"], layers=[7]), OptionError, "layer 7 does not exist"),
        (lambda: aa.open_store(Path(cli_store).parent / "nope.h5"), StoreError, "no such store"),
        (lambda: aa.prune(builtin), OptionError, "give importance"),
        (lambda: aa.triggers(cli_store, top_k=0), OptionError, "top_k must be at least 1"),
        (lambda: aa.triggers(cli_store, rank_by="x"), OptionError, "unknown rank_by"),
        (lambda: aa.attack(builtin), OptionError, "triggers is required"),
        (lambda: aa.importance(cli_store, model=builtin), OptionError, "not both"),
        (lambda: aa.predict(builtin, ["x"], mask=np.ones((2, 2))), OptionError, "mask must have shape"),
    ]
    for call, kind, text in cases:
        with pytest.raises(kind) as exc:
            call()
        assert isinstance(exc.value, AttattrError)
        assert text in str(exc.value) and "--" not in str(exc.value), str(exc.value)
    with aa.open_store(cli_store) as s:
        with pytest.raises(OptionError, match="compat"):
            aa.tree(s[0], compat="other")
        with pytest.raises(OptionError, match="example index"):
            s["a"]  # noqa: B018


def test_help_texts_written_out_agree_with_the_library():
    from attattr_cli.analysis.token_importance import METHODS
    from attattr_cli.cli.faithfulness import METHODS_HELP
    from attattr_cli.cli.score import RULES_HELP
    from attattr_cli.engine.integrate import RULES

    assert RULES_HELP == "; ".join(f"{k}: {v}" for k, v in RULES.items())
    assert METHODS_HELP == ", ".join(METHODS)


def test_cli_conventions_new_names_old_spellings_hidden(cli_store, tmp_path):
    import re

    def names(*cmd):
        r = runner.invoke(app, [*cmd, "--help"], terminal_width=200)
        return set(re.findall(r"(--[a-z][a-z-]*)", r.output))

    for cmd, new, old in [(("score",), "--steps-per-pass", "--step-batch"), (("importance",), "--methods", "--method"),
                          (("prune",), "--keep-heads", "--keep"), (("triggers",), "--top-k", "--top"),
                          (("attack",), "--top-k", "--top")]:
        shown = names(*cmd)
        assert new in shown and old not in shown, cmd
    for cmd in ("importance", "prune", "triggers", "attack", "faithfulness", "score", "finetune"):
        shown = names(cmd)
        assert {"--quiet", "--device"} <= shown or cmd == "finetune", cmd
        if cmd not in ("score", "finetune"):
            assert "--json" in shown, cmd
    # the old spellings still work, with the same result
    a = _cli("score", "--out", tmp_path / "a.h5", "--examples", "0:1", "--steps", "2", "--steps-per-pass", "1", "-q")
    b = _cli("score", "--out", tmp_path / "b.h5", "--examples", "0:1", "--steps", "2", "--step-batch", "1", "-q")
    with aa.open_store(a.stdout.strip()) as sa, aa.open_store(b.stdout.strip()) as sb:
        np.testing.assert_array_equal(sa[0].attribution, sb[0].attribution)
    # --json: the table on stdout instead of the path, the same numbers as the file
    r = _cli("importance", cli_store, "--methods", "attr", "--out", tmp_path / "i.h5", "--json", "-q")
    rows = json.loads(r.stdout)
    values = aa.importance(cli_store, methods="attr")["attr"]
    assert len(rows) == values.size
    assert all(values[x["layer"], x["head"]] == pytest.approx(x["value"]) for x in rows)
    r = _cli("importance", cli_store, "--method", "attr", "--out", tmp_path / "j.h5", "--csv", "-q")
    assert r.stdout.splitlines()[0] == "table,layer,head,value,rank,rank_low,rank_high,tau_halves"
    assert len(r.stdout.splitlines()) == values.size + 1


def test_model_results_and_progress_bar(builtin, cli_store, capsys):
    assert builtin.id == "attattr/synthetic-nli-bert" and builtin.config.num_labels == len(builtin.label_names)
    assert (builtin.num_layers, builtin.num_heads) == (builtin.config.num_hidden_layers,
                                                        builtin.config.num_attention_heads)
    assert aa.load_model(builtin) is builtin
    imp = aa.importance(cli_store, methods="attr", progress=True)
    assert json.loads(imp.to_json())["tables"]["attr"]["values"] == imp["attr"].tolist()
    trig = aa.triggers(cli_store, top_k=2)
    lines = trig.to_csv().splitlines()
    assert len(lines) == 1 + len(trig.triggers) and json.loads(trig.to_json()) == trig.to_dict()
    with pytest.raises(OptionError, match="progress must be"):
        aa.importance(cli_store, methods="attr", progress="yes")


def test_readme_python_example_is_short_and_uses_the_public_api():
    import re

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python"):]
    code = section[section.index("```python") + len("```python"):].split("```")[0].strip().splitlines()
    assert len(code) <= 15
    used = set(re.findall(r"\baa\.([a-z_0-9]+)\(", "\n".join(code)))
    assert used and used <= set(aa.__all__)
    assert {"load_model", "score", "importance", "prune", "triggers", "attack"} <= used


def test_readme_python_example_prints_what_the_readme_says(tmp_path, monkeypatch, capsys):
    """The README's Python block, run as written; its printed lines are the README's (numbers
    to 4 significant digits: other machines sum floats in another order)."""
    import re

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Python"):]
    code = section[section.index("```python") + len("```python"):].split("```")[0]
    shown = section[section.index("prints\n\n```\n") + len("prints\n\n```\n"):].split("```")[0].strip().splitlines()
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out.strip().splitlines()
    number = re.compile(r"-?\d+\.\d+(?:e-?\d+)?")
    assert len(printed) == len(shown)
    for got, want in zip(printed, shown):
        assert number.sub("#", got) == number.sub("#", want), (got, want)
        for a, b in zip(number.findall(got), number.findall(want)):
            assert float(a) == pytest.approx(float(b), rel=1e-4, abs=1e-6), (got, want)


def test_one_set_of_names_for_a_scored_example_wherever_it_is_read(tmp_path):
    from attattr_cli.store import Store

    path = tmp_path / "s.h5"
    scored = aa.score(examples="0:2")
    aa.score(examples="0:2", out=path)
    with Store(path) as s:
        plain = s.get(1)
    opened = aa.open_store(path)[1]
    for e in (scored[1], plain, opened):
        assert e.prediction == scored[1].prediction and e.gold_label == scored[1].gold_label
        assert np.array_equal(e.probabilities, scored[1].probabilities) and np.array_equal(e.probs, e.probabilities)
        assert e.top(2) == scored[1].top(2)
        assert e.converged == scored[1].converged
        assert e.label_names == ["entailment", "neutral", "contradiction"]


# ----------------------------------------------------------------------------- option groups (api/groups.py)


def _parameters(fn) -> list[str]:
    """The parameters a reader sees (the old keywords' catch-all aside)."""
    sig = inspect.signature(getattr(fn, "__checked__", fn))
    return [p.name for p in sig.parameters.values() if p.kind is not p.VAR_KEYWORD]


def test_score_and_faithfulness_read_as_a_short_list_of_concepts():
    """score took 43 parameters and faithfulness 27; what belongs together is one group now."""
    assert len(_parameters(aa.score)) <= 20, _parameters(aa.score)
    assert len(_parameters(aa.faithfulness)) <= 20, _parameters(aa.faithfulness)
    assert {"integration", "target", "compute", "hooks"} <= set(_parameters(aa.score))
    assert {"integration", "target", "compute", "adversarial"} <= set(_parameters(aa.faithfulness))
    for cls in (aa.Integration, aa.Target, aa.Compute, aa.Hooks, aa.Adversarial):
        with pytest.raises(Exception):  # frozen: a group is a value
            cls().x = 1
        assert cls() == cls()


def test_old_keywords_warn_once_and_give_the_same_result(builtin, tmp_path):
    with pytest.warns(FutureWarning) as said:
        old = aa.score(builtin, examples="0:2", steps=2, rule="left", output="logit", store_dtype="float16")
    future = [w for w in said if issubclass(w.category, FutureWarning)]
    assert len(future) == 1 and future[0].filename == __file__  # at the caller's line
    text = str(future[0].message)
    assert "\n" not in text and "steps=" in text and "output=" in text
    assert "integration=aa.Integration(" in text and "target=aa.Target(" in text and "compute=aa.Compute(" in text
    new = aa.score(builtin, examples="0:2", integration=aa.Integration(steps=2, rule="left"),
                   target=aa.Target(output="logit"), compute=aa.Compute(store_dtype="float16"))
    for a, b in zip(old, new):
        for name in ("attribution", "attention", "residual", "head_max", "probs"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    # into a store: the same fingerprint and arrays, whichever spelling
    from attattr_cli.store import Store

    with pytest.warns(FutureWarning):
        aa.score(builtin, examples="0:2", out=tmp_path / "old.h5", steps=2, target="gold")
    aa.score(builtin, examples="0:2", out=tmp_path / "new.h5", integration=aa.Integration(steps=2),
             target=aa.Target(target="gold"))
    with Store(tmp_path / "old.h5") as a, Store(tmp_path / "new.h5") as b:
        assert a.fingerprint == b.fingerprint and a.indices() == b.indices() == [0, 1]
        for i in a.indices():
            np.testing.assert_array_equal(a.get(i).attribution, b.get(i).attribution)


def test_faithfulness_old_keywords_warn_and_give_the_same_report(cli_store):
    common = dict(methods="attention_last,attr", permutations=0)
    with pytest.warns(FutureWarning, match=r"device=, truncate= are the old spelling.*compute=aa.Compute"):
        old = aa.faithfulness(cli_store, device="cpu", truncate=False, **common)
    new = aa.faithfulness(cli_store, compute=aa.Compute(device="cpu"), **common)
    drop = ("seconds",)
    assert {k: v for k, v in old.report.items() if k not in drop} == {k: v for k, v in new.report.items() if k not in drop}
    with pytest.raises(OptionError, match="epsilons is given twice"):
        aa.faithfulness(cli_store, adversarial=aa.Adversarial(layer=0), epsilons=[0.1], **common)
    with pytest.raises(OptionError, match=r"dtype=\.\.\.\): with a store nothing is scored"):
        aa.faithfulness(cli_store, compute=aa.Compute(dtype="float64"), **common)
    with pytest.raises(OptionError, match="faithfulness attributes the target class"):
        aa.faithfulness(cli_store, target=aa.Target(foil="neutral"), **common)


def test_the_new_spelling_and_the_librarys_own_calls_say_nothing(builtin, tmp_path):
    """The group form, the target shorthand, the CLI and the library's own calls of score
    (faithfulness scoring first) raise no FutureWarning."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        aa.score(builtin, examples="0:1", target="gold", integration=aa.Integration(steps=2))
        aa.faithfulness(model=builtin, examples="0:2", methods="attention_last,attr", permutations=0,
                        integration=aa.Integration(steps=2), target="gold")
        _cli("score", "--out", tmp_path / "c.h5", "--examples", "0:1", "--steps", "2", "--logit", "-q")


def test_old_and_new_spellings_refuse_what_they_refused():
    """An unknown keyword, a flat keyword given again in its group, and a wrong value in either
    spelling: one OptionError naming the argument, before any work."""
    with pytest.raises(OptionError, match=r"score\(\): got an unexpected keyword argument 'colour'"):
        aa.score(out="x.h5", colour="red")
    with pytest.raises(OptionError, match=r"steps is given twice: as steps= and in integration=aa.Integration"):
        aa.score(out="x.h5", steps=2, integration=aa.Integration(tol=0.1))
    with pytest.raises(OptionError, match="output is given twice"):
        aa.score(out="x.h5", output="logit", target=aa.Target(output="logprob"))
    with pytest.raises(OptionError, match=r"^steps must be a whole number, got 2.0$"):
        aa.score(out="x.h5", steps=2.0)
    with pytest.raises(OptionError, match=r"^steps must be a whole number, got 2.0$"):
        aa.Integration(steps=2.0)
    with pytest.raises(OptionError, match=r"^dist_timeout must be above 0, got 0$"):
        aa.Compute(dist_timeout=0)
    with pytest.raises(OptionError, match=r"^integration must be an aa.Integration, got 3$"):
        aa.score(out="x.h5", integration=3)
    with pytest.raises(OptionError, match=r"^target must be an aa.Target, or the class"):
        aa.score(out="x.h5", target=3)
    with pytest.raises(OptionError, match="unknown rule 'simpson'"):
        aa.score(out="x.h5", integration=aa.Integration(rule="simpson"))
    with pytest.raises(OptionError, match=r"faithfulness\(\): got an unexpected keyword argument 'max_nodes'"):
        aa.faithfulness("s.h5", max_nodes=9)  # not one of faithfulness's old keywords
    assert not Path("x.h5").exists()
