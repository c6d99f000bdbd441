"""Results in a notebook: short reprs, rich displays of the right kind, plots as Figures,
tables as DataFrames, in-memory results saved as the store score(out=) writes, language-model
predictions as tokens, inputs of unknown words named. On the built-in default (3 layers x 4
heads), a few examples at few steps."""

from __future__ import annotations

import json
import shutil
import sys
import warnings

import numpy as np
import pytest
from matplotlib.figure import Figure

import attattr_cli as aa
from attattr_cli.errors import OptionError, StoreError
from attattr_cli.store import Store
from conftest import build_model, run_cli

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def done(tmp_path_factory):
    """Every public result once: scored in memory and into a store, and each analysis."""
    d = tmp_path_factory.mktemp("nb")
    model = aa.load_model()
    res = aa.score(model, examples="0:3", steps=2)
    report = aa.score(model, examples="0:3", steps=2, out=d / "s.h5")
    store = aa.open_store(report.out)
    imp = aa.importance(report.out)
    trig = aa.triggers(report.out, top_k=2)
    out = {
        "dir": d, "model": model, "res": res, "store_path": d / "s.h5", "store": store, "imp": imp, "trig": trig,
        "tree": aa.tree(res[1]),
        "prune": aa.prune(model, imp, examples="0:8", rates=[0, 0.5]),
        "faith": aa.faithfulness(model=model, examples="0:3", steps=2, methods="attention_mean,attr", permutations=2,
                                 score_store=d / "f.h5"),
        "attack": aa.attack(model, trig, examples="0:6", controls=2),
        "pred": aa.predict(model, examples="0:5"),
        "picture": aa.view(d / "s.h5", 1),
        "svg": aa.view(d / "s.h5", 1, fmt="svg", layers=[0]),
        "info": aa.info(d / "s.h5"),
        "highlight": res[0].highlight(),
    }
    yield out
    store.close()


def test_reprs_are_short_and_hold_no_bytes_or_arrays(done):
    objs = {k: done[k] for k in ("model", "res", "store", "imp", "trig", "tree", "prune", "faith", "attack", "pred",
                                 "picture", "svg", "info", "highlight")}
    objs["example"] = done["res"][0]
    for name, obj in objs.items():
        text = repr(obj)
        assert len(text) < 2048 and text.count("\n") <= 5, (name, len(text))
        assert "b'" not in text and "\\x" not in text and "array(" not in text and "<div" not in text, name
    p = done["picture"]
    assert repr(p).startswith("Picture(png, ") and " px, " in repr(p) and f"{len(p.data):,} bytes" in repr(p)
    w, h = p.size()
    assert w > 100 and h > 100
    assert repr(done["res"]).startswith("Results(3 examples")
    assert "attr" in repr(done["imp"]) and "3 layers x 4 heads" in repr(done["imp"])


def test_rich_displays_give_the_right_mime_data(done):
    assert done["picture"]._repr_png_().startswith(PNG) and done["picture"]._repr_svg_() is None
    assert "<svg" in done["svg"]._repr_svg_() and done["svg"]._repr_png_() is None
    assert "<svg" in done["tree"]._repr_svg_()
    for key in ("res", "store", "imp", "prune", "faith", "trig", "attack", "pred", "info"):
        html = done[key]._repr_html_()
        assert "<table" in html and "<script" not in html, key
    e = done["res"][0]
    assert all(t in done["res"]._repr_html_() for t in ("entailment", "neutral", "contradiction")
               if t in [x.prediction for x in done["res"]])
    hl = done["highlight"]
    assert isinstance(hl, str) and hl._repr_html_() == str(hl) and str(hl).count("<span") == len(e.tokens)
    assert "<script" not in str(hl) and "style=" in str(hl)  # inline styles: works in an untrusted notebook
    for k in ("imp", "prune", "faith"):  # tables, not pictures of them: no PNG stored twice
        assert not hasattr(done[k], "_repr_png_")


def test_plots_are_figures_saved_on_request(done, tmp_path):
    figs = {"imp": done["imp"].plot(), "prune": done["prune"].plot(), "faith": done["faith"].plot(),
            "view": aa.view(done["store_path"], 1, fmt="figure", layers=[0], tree=False),
            "example": done["res"][0].figure(layers=[0], tree=False),
            "tree": done["tree"].figure()}
    for name, fig in figs.items():
        assert isinstance(fig, Figure), name
        assert fig._repr_png_().startswith(PNG), name
    figs["imp"].save(tmp_path / "imp.svg")
    assert "<svg" in (tmp_path / "imp.svg").read_text()
    assert isinstance(done["prune"].plot(tmp_path / "p.png"), Figure) and (tmp_path / "p.png").read_bytes().startswith(PNG)
    assert isinstance(done["faith"].plot(tmp_path / "f.pdf"), Figure) and (tmp_path / "f.pdf").read_bytes()[:4] == b"%PDF"
    figs["view"].savefig(tmp_path / "v.png")
    assert (tmp_path / "v.png").read_bytes().startswith(PNG)
    import matplotlib.pyplot as plt

    assert plt.get_fignums() == []  # made without pyplot: nothing left open
    with pytest.raises(OptionError, match="Figure"):
        aa.view(done["store_path"], 1, tmp_path / "x.png", fmt="figure")


def test_to_pandas_columns_and_values(done):
    res, store = done["res"], done["store"]
    heads = res.to_pandas()
    assert list(heads.columns) == ["example", "layer", "head", "head_max", "head_sum", "layer_residual", "converged",
                                   "prediction", "gold"]
    assert len(heads) == 3 * 3 * 4
    e = res[2]
    rows = heads[(heads.example == e.index) & (heads.layer == 1)]
    np.testing.assert_allclose(rows.head_max, e.head_max[1], rtol=1e-6)
    np.testing.assert_allclose(rows.head_sum, e.attribution[1].astype(np.float64).sum(axis=(1, 2)), rtol=1e-5)
    assert set(rows.prediction) == {e.prediction}
    tokens = res.to_pandas("tokens")
    assert list(tokens.columns) == ["example", "position", "token", "piece", "importance"]
    assert len(tokens) == sum(len(x.tokens) for x in res)
    np.testing.assert_allclose(tokens[tokens.example == e.index].importance, e.token_importance())
    assert store.to_pandas().equals(heads)  # the store holds what the memory holds
    assert e.to_pandas().equals(heads[heads.example == e.index].reset_index(drop=True))
    imp = done["imp"].to_pandas()
    assert list(imp.columns) == ["table", "method", "seed", "layer", "head", "value", "rank", "rank_low", "rank_high"]
    attr = imp[imp.table == "attr"]
    assert len(attr) == 12 and sorted(attr["rank"]) == list(range(1, 13))
    best = attr.sort_values("rank").iloc[0]
    assert (int(best["layer"]), int(best["head"])) == done["imp"].ranking("attr")[0]
    curves = done["prune"].to_pandas()
    assert list(curves.columns) == ["analysis", "method", "rate", "heads_masked", "k", "metric", "value", "low", "high"]
    c = done["prune"].curves
    got = curves[(curves.method == "attr")].value.tolist()
    assert got == c["methods"]["attr"]["accuracy"]
    faith = done["faith"].to_pandas()
    assert list(faith.method) == ["attention_mean", "attr"] and list(faith.columns) == list(done["faith"].rows[0])
    trig = done["trig"].to_pandas()
    assert list(trig.columns)[:4] == ["rank", "class", "class_rank", "tokens"]
    assert trig.tokens.tolist() == [" ".join(t.tokens) for t in done["trig"].triggers]
    att = done["attack"].to_pandas()
    assert att["class"].tolist() == [r["class"] for r in done["attack"].table] and "beats_controls" in att
    pred = done["pred"].to_pandas()
    assert pred.prediction.tolist() == done["pred"].predictions
    np.testing.assert_allclose(pred[["p_entailment", "p_neutral", "p_contradiction"]].to_numpy(),
                               done["pred"].probabilities)


def test_to_pandas_without_pandas_names_the_install(done, monkeypatch):
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(OptionError, match=r"pip install 'attattr\[notebook\]'"):
        done["imp"].to_pandas()


def test_saved_results_are_the_store_score_writes(done, tmp_path):
    res = done["res"]
    res.save(tmp_path / "mem.h5")
    res[1].save(tmp_path / "one.h5")
    with Store(done["store_path"]) as a, Store(tmp_path / "mem.h5") as b, Store(tmp_path / "one.h5") as c:
        assert a.indices() == b.indices() == [0, 1, 2] and c.indices() == [1]
        assert a.fingerprint == b.fingerprint == c.fingerprint
        pa, pb = dict(a.provenance), dict(b.provenance)
        for k in ("model", "weights_sha256", "options", "label_names", "task", "num_layers", "num_heads"):
            assert pa.get(k) == pb.get(k), k
        for i in a.indices():
            x, y = a.get(i), b.get(i)
            assert x.tokens == y.tokens and x.pred == y.pred
            for field in ("attribution", "attention", "head_max", "residual", "probs"):
                np.testing.assert_array_equal(getattr(x, field), getattr(y, field))
        np.testing.assert_array_equal(c.get(1).attribution, b.get(1).attribution)
    info = run_cli("info", tmp_path / "mem.h5", "--json")
    assert info.exit_code == 0, info.output
    assert json.loads(info.stdout)["examples"] == 3
    v = run_cli("view", tmp_path / "one.h5", "-n", "1", "-o", tmp_path / "one.png")
    assert v.exit_code == 0 and (tmp_path / "one.png").read_bytes().startswith(PNG)
    imp = run_cli("importance", tmp_path / "mem.h5", "-o", tmp_path / "imp.h5")
    assert imp.exit_code == 0, imp.output
    np.testing.assert_allclose(aa.importance(tmp_path / "mem.h5")["attr"], done["imp"]["attr"])
    with pytest.raises(OptionError, match=r"\.h5"):
        res.save(tmp_path / "x.json")
    done["store"][2].save(tmp_path / "two.h5")  # from an open store: its example copied as stored
    res[1:].save(tmp_path / "tail.h5")  # a slice is Results too
    with Store(tmp_path / "two.h5") as two, Store(tmp_path / "tail.h5") as tail, Store(done["store_path"]) as a:
        assert two.indices() == [2] and tail.indices() == [1, 2]
        np.testing.assert_array_equal(two.get(2).attribution, a.get(2).attribution)
    with pytest.raises(StoreError, match="come from"):
        done["store"][2].save(done["store_path"])
    mixed = aa.Results([res[0], done["store"][1]])
    with pytest.raises(OptionError, match="scored together"):
        mixed.save(tmp_path / "mixed.h5")


def test_info_is_a_dict_that_shows_short(done):
    info = done["info"]
    assert isinstance(info, dict) and info["examples"] == 3
    assert json.loads(json.dumps(info))["examples"] == 3
    assert repr(info).startswith("info(") and "provenance" not in repr(info).split("+")[0]


def test_language_model_predictions_are_tokens(tokenizer, tmp_path):
    lm = build_model("gpt2", lm=True)
    model = aa.load_model((lm, tokenizer), lm=True)
    res = aa.score(model, ["w1 w2 w3 w4"], steps=2)
    e = res[0]
    assert isinstance(e.prediction_id, int) and e.prediction == tokenizer.convert_ids_to_tokens([e.prediction_id])[0]
    assert e.target_label == tokenizer.convert_ids_to_tokens([e.target_id])[0]
    assert not e.prediction.isdigit()
    res.save(tmp_path / "lm.h5")
    with aa.open_store(tmp_path / "lm.h5") as s:
        assert s[e.index].prediction == e.prediction and s[e.index].prediction_id == e.prediction_id
        assert e.prediction in repr(s[e.index]) and e.prediction in s._repr_html_()


def test_unknown_words_are_named_once(done):
    with pytest.warns(UserWarning, match=r"2 of 2 examples .* unknown token \[UNK\] of attattr/synthetic-nli-bert") as got:
        aa.score(done["model"], [("a premise", "a hypothesis"), "one sentence"], steps=2)
    assert len([w for w in got if "unknown token" in str(w.message)]) == 1
    assert "\n" not in str(got[0].message)
    with pytest.warns(UserWarning, match=r"1 of 1 examples \(0\) are mostly the unknown token") as got:
        aa.predict(done["model"], ["where is the station"])  # every function that takes inputs
    assert len(got) == 1 and got[0].filename == __file__  # the line is the caller's
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        aa.score(done["model"], [("gabu dite blick hapa", "feli bero zupe lomi")], steps=2)
        aa.predict(done["model"], [("gabu dite blick hapa", "feli bero zupe lomi")])


def test_show_displays_once_and_returns_nothing(done, monkeypatch):
    import types

    shown = []
    ipython = types.ModuleType("IPython")
    ipython.display = types.ModuleType("IPython.display")
    ipython.display.display = shown.append
    e = done["res"][0]
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "IPython", ipython)
        mp.setitem(sys.modules, "IPython.display", ipython.display)
        assert e.show(layers=[0]) is None
    assert len(shown) == 1 and "<script" in shown[0]._repr_html_() and len(repr(shown[0])) < 200
    with monkeypatch.context() as mp:
        mp.setitem(sys.modules, "IPython", None)  # no IPython, even where another test imported it
        mp.setitem(sys.modules, "IPython.display", None)
        with pytest.raises(OptionError, match="IPython"):
            e.show()
    assert shutil.which("dot") is None or "<svg" in done["tree"]._repr_svg_()


def test_the_command_line_says_unknown_words_in_one_line(tmp_path):
    import os
    import subprocess
    from pathlib import Path

    from attattr_cli.models.default import DEFAULT_MODEL_DIR

    data = tmp_path / "unknown.tsv"
    data.write_text("premise\thypothesis\tlabel\nwhere is the station\tthe cat sat down\tneutral\n")
    r = subprocess.run([sys.executable, "-m", "attattr_cli", "importance", "-m", str(DEFAULT_MODEL_DIR), "-d", str(data),
                        "--methods", "taylor", "-o", str(tmp_path / "imp.h5"), "-q"],
                       capture_output=True, text=True,
                       env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stderr.splitlines() if "unknown token" in x]
    assert len(lines) == 1 and lines[0].startswith("Warning: 1 of 1 examples (0) are mostly the unknown token [UNK]")
    assert "UserWarning" not in r.stderr
