"""Views: `attattr view` (PNG/SVG/PDF/HTML) of BERT, GPT-2 (causal), BART families and long
decoder stores (--keep sum, --keep none with --top-k), `attattr report`, the notebook
functions, the tree legend, the importance figure, and the HTML in a real headless Chromium."""

from __future__ import annotations

import html
import io
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attattr_cli.cli import app
from attattr_cli.errors import OptionError
from attattr_cli.store import Store
from attattr_cli.views import ViewSpec, build_view, example_html, from_store, highlight_html, save
from browser import Chromium, find_chromium, painted_colours, strip_scripts
from conftest import WORDS, build_model, with_sentiment_labels

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[1]
LONG = " ".join(WORDS[i % len(WORDS)] for i in range(90))  # 92 tokens with [CLS] and [SEP]


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _ok(*args):
    r = _run(*args)
    assert r.exit_code == 0, r.output
    return r


def _one_error(r, text: str) -> None:
    assert r.exit_code != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and text in lines[0], r.stderr


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The built-in default (3 examples, 4 steps), tiny GPT-2 and BART, and a Llama decoder
    (positions up to 512) with a 92-token prompt stored with --keep sum / none and --top-k."""
    import transformers as tf
    from transformers import BertTokenizerFast

    d = tmp_path_factory.mktemp("views")
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    tok = BertTokenizerFast(str(d / "vocab.txt"), model_max_length=512)

    def saved(model, name):
        model.save_pretrained(d / name)
        tok.save_pretrained(d / name)
        return d / name

    gpt2 = saved(build_model("gpt2", num_labels=2, layers=2, lm=True), "gpt2")
    bart = saved(with_sentiment_labels(build_model("bart", num_labels=2, layers=2)), "bart")
    cfg = tf.LlamaConfig(vocab_size=5 + len(WORDS), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=37, max_position_embeddings=512,
                         bos_token_id=2, eos_token_id=3)
    llama = saved(tf.LlamaForCausalLM(cfg).eval(), "llama")
    tsv = d / "pairs.tsv"
    tsv.write_text("sentence\tlabel\n" + "\n".join(f"{' '.join(WORDS[i:i + 5])}\t{i % 2}" for i in range(2)) + "\n")
    s = {k: d / f"{k}.h5" for k in ("default", "gpt2", "bart", "long_sum", "long_none", "no_maps", "gen")}
    _ok("score", "--out", s["default"], "--examples", "0:3", "--steps", "4", "-q")
    _ok("score", "--lm", "--model", gpt2, "--prompt", "w1 w2 w3 w4 w5 w6", "--steps", "4", "-q", "--out", s["gpt2"])
    _ok("score", "--model", bart, "--data", tsv, "--examples", "0:1", "--steps", "4", "-q", "--out", s["bart"])
    for key, extra in (("long_sum", ["--keep", "sum", "--top-k", "4"]), ("long_none", ["--keep", "none", "--top-k", "4"]),
                       ("no_maps", ["--keep", "none"])):
        _ok("score", "--lm", "--model", llama, "--prompt", LONG, *extra, "--steps", "2", "-q", "--out", s[key])
    _ok("score", "--lm", "--model", llama, "--prompt", "w1 w2 w3", "--prompt", "w4 w5", "--generate", "3", "--foil", "w9",
        "--logprob", "--steps", "2", "-q", "--out", s["gen"])  # two generations of 3 steps against a foil
    return s


def _get(path, index=0, family=None):
    with Store(path) as st:
        return from_store(st, index, family=family)


# -- the numbers ------------------------------------------------------------------------
def test_view_numbers_are_the_stored_maps(stores):
    ld = _get(stores["default"], 1)
    e = ld.example
    v = build_view(e, ld.labels, ViewSpec())
    assert v.mode == "full" and v.layers == e.layers and v.heads == ["sum"] and v.masked is None
    np.testing.assert_allclose(v.maps["attr"][:, 0], e.attribution.sum(axis=1), rtol=1e-6)
    np.testing.assert_allclose(v.maps["attention"][:, 0], e.attention.mean(axis=1), rtol=1e-6)
    assert v.scale["attr"] == pytest.approx(np.abs(e.attribution.sum(axis=1)).max())
    np.testing.assert_allclose(v.importance["values"], e.attribution.sum(axis=(0, 1, 2)), rtol=1e-5, atol=1e-9)
    # top-k: the largest |entries| over every head of every layer, in order
    flat = np.sort(np.abs(e.attribution).ravel())[::-1][:10]
    assert [abs(t["value"]) for t in v.topk] == pytest.approx(flat.tolist())
    t = v.topk[0]
    assert e.attribution[e.layers.index(t["layer"]), int(t["head"]), t["query"], t["key"]] == pytest.approx(t["value"])
    assert t["query_token"] == e.tokens[t["query"]]
    h = v.header
    assert h["gold"] == ld.labels[e.gold] and h["prediction"] == ld.labels[e.pred]
    assert h["probability"] == pytest.approx(float(e.probs[e.pred]))
    assert list(h["residual"].values()) == pytest.approx(e.residual.tolist())
    one = build_view(e, ld.labels, ViewSpec(layers=[-1], heads=2, show=["attr"]))
    assert one.layers == [e.layers[-1]] and list(one.maps) == ["attr"]
    np.testing.assert_allclose(one.maps["attr"][0, 0], e.attribution[-1, 2], rtol=1e-6)


def test_attention_of_the_scored_layer_when_the_store_keeps_every_layer(stores, tmp_path):
    path = tmp_path / "l1.h5"
    _ok("score", "--out", path, "--examples", "0:1", "--steps", "2", "--layers", "1", "-q")
    e = _get(path).example
    assert e.layers == [1] and e.attention.shape[0] == 3  # attention of every layer, attribution of layer 1
    v = build_view(e)
    np.testing.assert_allclose(v.maps["attention"][0, 0], e.attention[1].mean(axis=0), rtol=1e-6)
    np.testing.assert_allclose(v.maps["attr"][0, 0], e.attribution[0].sum(axis=0), rtol=1e-6)


def test_causal_gpt2_is_masked_not_zero(stores, tmp_path):
    e = _get(stores["gpt2"]).example
    v = build_view(e)
    n = len(e.tokens)
    assert v.masked is not None and v.masked.sum() == n * (n - 1) // 2
    assert (v.masked == np.triu(np.ones((n, n), bool), 1)).all()
    assert any("masked" in note for note in v.notes)
    assert v.header["prediction"] == e.meta["lm"]["predicted_token"]


def test_bart_families(stores):
    enc, dec, cross = (_get(stores["bart"], family=f).example for f in ("encoder", "decoder", "cross"))
    ve, vd, vc = build_view(enc), build_view(dec), build_view(cross)
    assert ve.masked is None and vc.masked is None and vd.masked is not None
    assert vc.query_tokens == cross.decoder_tokens and vc.key_tokens == enc.tokens
    assert vc.importance["tokens"] == enc.tokens  # cross: what each input token gives to the decoder
    r = _run("view", stores["bart"], "-n", "0", "--family", "cross", "-o", "-", "--format", "svg", "-q")
    assert r.exit_code == 0 and "cross" in r.stdout


def test_long_keep_sum_shows_a_window(stores, tmp_path):
    e = _get(stores["long_sum"]).example
    assert e.attribution is None and e.head_sum is not None and len(e.tokens) == 92
    v = build_view(e)
    assert v.mode == "window" and len(v.q_idx) == 16 and len(v.k_idx) <= 64
    assert v.q_idx[-1] == 91  # the LM predicts from the last position
    assert any("window of 16" in n for n in v.notes)
    np.testing.assert_allclose(v.maps["attr"][:, 0], np.asarray(e.head_sum)[:, v.q_idx][:, :, v.k_idx], rtol=1e-6)
    assert v.masked is not None and (v.masked == (np.asarray(v.k_idx)[None] > np.asarray(v.q_idx)[:, None])).all()
    w = build_view(e, spec=ViewSpec(queries=[40], window=8))
    assert w.q_idx == list(range(36, 44))
    # stored top-k rows, by |value|
    stored = sorted(np.abs(e.topk_value).ravel().tolist(), reverse=True)[:10]
    assert [abs(t["value"]) for t in v.topk] == pytest.approx(stored)
    png = tmp_path / "long.png"
    _ok("view", stores["long_sum"], "-n", "0", "-o", png, "-q")
    import matplotlib.image as mpimg

    height, width = mpimg.imread(png).shape[:2]
    assert width < 5000 and height < 3000  # never a 92 x 92 map


def test_long_keep_none_shows_top_k(stores, tmp_path):
    e = _get(stores["long_none"]).example
    v = build_view(e)
    assert v.mode == "top-k" and not v.maps and len(v.topk) == 10
    assert any("--keep none" in n for n in v.notes)
    html_file = tmp_path / "none.html"
    _ok("view", stores["long_none"], "-n", "0", "-o", html_file, "-q")
    text = html_file.read_text()
    data = json.loads(re.search(r'id="aa-data">(.*?)</script>', text, re.S).group(1))
    assert data["mode"] == "top-k" and data["maps"] == {} and len(data["topk"]) == 10
    assert [t["value"] for t in data["topk"]] == pytest.approx([t["value"] for t in v.topk], rel=1e-3)


def test_stored_token_importance_colours_the_text(stores, tmp_path):
    from attattr_cli.store import TokenImportanceStore

    path = tmp_path / "ti.h5"
    shutil.copy(stores["default"], path)
    e = _get(path).example
    values = np.linspace(-1.0, 2.0, len(e.tokens))
    with TokenImportanceStore(path) as w:
        w.write(0, "occlusion", values, {"erase": "mask"}, "drop in f when the token is masked")
    page = _ok("view", path, "-n", "0", "--importance", "occlusion", "-o", "-", "-q").stdout
    data = json.loads(re.search(r'id="aa-data">(.*?)</script>', page, re.S).group(1))
    assert data["importance"]["name"] == "occlusion" and data["importance"]["tokens"] == e.tokens
    assert data["importance"]["values"] == pytest.approx(values, rel=1e-3)
    _one_error(_run("view", path, "-n", "0", "--importance", "lime", "-o", tmp_path / "x.png"),
               "has no token importance 'lime'; it has: attr-colsum, occlusion")


# -- files --------------------------------------------------------------------------------
def test_png_svg_pdf_read_back(stores, tmp_path):
    import matplotlib.image as mpimg

    e = _get(stores["default"]).example
    _ok("view", stores["default"], "-n", "0", "-o", tmp_path / "v.png", "-q")
    img = mpimg.imread(tmp_path / "v.png")
    assert img.shape[0] > 800 and img.shape[1] > 1000 and img[..., :3].std() > 0.05
    _ok("view", stores["default"], "-n", "0", "-o", tmp_path / "v.svg", "-q")
    svg = (tmp_path / "v.svg").read_text()
    texts = set(re.findall(r"<text[^>]*>([^<]*)</text>", svg))
    assert set(e.tokens) - {"[CLS]", "[SEP]"} <= {t.strip() for t in texts}
    pdf = tmp_path / "v.pdf"
    _ok("view", stores["default"], "-n", "0", "-o", pdf, "-q")
    assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 10_000
    r = _ok("view", stores["default"], "-n", "0", "-o", "-", "-q")  # stdout: HTML by default
    assert r.stdout.startswith("<!DOCTYPE html>") and "AttattrView.render" in r.stdout
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//|url\(\s*[\"']?https?:|@import", r.stdout)  # nothing fetched


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed")
def test_tree_at_the_foot_of_figures_and_pages(stores, tmp_path):
    import matplotlib.image as mpimg

    _ok("view", stores["default"], "-n", "0", "-o", tmp_path / "t.png", "-q")
    _ok("view", stores["default"], "-n", "0", "--no-tree", "-o", tmp_path / "n.png", "-q")
    with_tree, without = mpimg.imread(tmp_path / "t.png"), mpimg.imread(tmp_path / "n.png")
    assert with_tree.shape[1] == without.shape[1] and with_tree.shape[0] > without.shape[0] + 300
    page = _ok("view", stores["default"], "-n", "0", "-o", "-", "-q").stdout
    data = json.loads(re.search(r'id="aa-data">(.*?)</script>', page, re.S).group(1))
    assert "tree_svg" not in data  # the tree is drawn once, statically, below the view (scripts or not)
    tree = re.search(r'<div class="aa-tree">(<svg.*?</svg>)\s*</div>', page, re.S).group(1)
    assert "prediction" in tree and "attributed F = " in tree and 'id="aa-graph0"' in tree
    cross = _ok("view", stores["bart"], "-n", "0", "--family", "cross", "-o", "-", "-q").stdout
    assert 'class="aa-tree"' not in cross  # no tree


def test_any_object_with_the_names_renders_and_many_layers_wrap(tmp_path):
    """Duck typing: a plain namespace with a StoredExample's names; 12 layers wrap into two blocks."""
    from types import SimpleNamespace

    import matplotlib.image as mpimg

    rng = np.random.default_rng(0)
    L, H, n = 12, 2, 10
    toks = [f"t{i}" for i in range(n)]
    e = SimpleNamespace(index=5, tokens=toks, layers=list(range(L)), attribution=rng.normal(size=(L, H, n, n)),
                        attention=rng.random((L, H, n, n)), residual=np.zeros(L), gold=1, pred=0, target=0,
                        probs=np.array([0.7, 0.3]), text_a="a text", text_b=None, meta={})
    v = save(e, tmp_path / "wide.png", ["no", "yes"], tree=False, layers="all")
    assert v.header["gold"] == "yes" and v.header["correct"] is False and v.layers == list(range(12))
    wide = mpimg.imread(tmp_path / "wide.png")
    six = save(SimpleNamespace(**dict(vars(e), layers=list(range(6)), attribution=e.attribution[:6],
                                      attention=e.attention[:6], residual=np.zeros(6))),
               tmp_path / "six.png", ["no", "yes"], tree=False)
    assert six.layers == list(range(6))
    one_block = mpimg.imread(tmp_path / "six.png")
    assert wide.shape[1] <= one_block.shape[1] * 1.4 and wide.shape[0] > one_block.shape[0] * 1.4  # wrapped


def test_bad_input_one_error_line_nothing_written(stores, tmp_path):
    out = tmp_path / "v.png"
    _one_error(_run("view", stores["default"], "-n", "7", "-o", out), "example 7 is not in")
    _one_error(_run("view", stores["default"], "-n", "0", "--layers", "5", "-o", out),
               "layer 5 was not scored for example 0; scored layers: 0, 1, 2")
    _one_error(_run("view", stores["no_maps"], "-n", "0", "-o", out), "keeps no attribution maps")
    _one_error(_run("view", stores["default"], "-n", "0", "-o", tmp_path / "nowhere" / "v.png"),
               "the folder")
    _one_error(_run("view", stores["long_sum"], "-n", "0", "--heads", "all", "-o", out), "keeps head sums only")
    _one_error(_run("view", stores["default"], "-n", "0", "--heads", "9", "-o", out), "head 9 is out of range")
    _one_error(_run("view", stores["default"], "-n", "0", "-o", tmp_path / "v.gif"), "cannot tell the format")
    _one_error(_run("view", stores["default"], "-n", "0", "-o", "-", "--format", "png"), "goes to a file")
    _one_error(_run("view", stores["long_sum"], "-n", "0", "--queries", "200", "-o", out), "query position 200")
    _one_error(_run("report", stores["default"], "-o", tmp_path / "nowhere" / "r.html"), "the folder")
    assert not out.exists() and not (tmp_path / "nowhere").exists() and list(tmp_path.iterdir()) == []


# -- notebook functions --------------------------------------------------------------------
def test_highlight_html_colours_by_sign_and_size():
    text = highlight_html(["good", "<b>", "bad", "meh"], [2.0, 1.0, -2.0, 0.0])
    spans = re.findall(r'style="background:(#[0-9a-f]{6});', text)
    green, red = np.array([41, 158, 61]), np.array([214, 48, 39])
    expected = [green, 255 + (green - 255) * 0.5, red, np.array([255, 255, 255])]  # full, half green; full red; white
    got = [np.array([int(h[i:i + 2], 16) for i in (1, 3, 5)]) for h in spans]
    assert len(got) == 4 and all(np.abs(g - x).max() <= 0.5 for g, x in zip(got, expected))
    assert "&lt;b&gt;" in text and "<b>" not in text
    with pytest.raises(OptionError, match="2 tokens but 1 scores"):
        highlight_html(["a", "b"], [1.0])


def test_example_html_show_and_save(stores, tmp_path, monkeypatch):
    ld = _get(stores["default"])
    a = example_html(ld.example, ld.labels)
    b = example_html(ld.example, ld.labels)
    ids = re.findall(r'<div id="(aa-[0-9a-f]+)"', a)
    assert len(ids) == 1 and ids != re.findall(r'<div id="(aa-[0-9a-f]+)"', b)
    assert "AttattrView.render" in a and 'class="aa-still"' in a.split(f'<div id="{ids[0]}">')[1]
    tree_ids = set(re.findall(r'<g id="([^"]+)"', a)) | set(re.findall(r'<g id="([^"]+)"', b))
    assert tree_ids and all(i.startswith("aa-") for i in tree_ids)  # the tree's SVG ids are per display too
    assert not set(re.findall(r'\bid="([^"]+)"', a)) & set(re.findall(r'\bid="([^"]+)"', b))
    for name in ("x.html", "x.png", "x.svg"):
        view = save(ld.example, tmp_path / name, ld.labels, heads="all")
        assert (tmp_path / name).stat().st_size > 1000 and view.heads == ["0", "1", "2", "3"]
    from attattr_cli.views import show

    shown = []
    ipython = types.ModuleType("IPython")
    ipython.display = types.ModuleType("IPython.display")
    ipython.display.display = shown.append
    with monkeypatch.context() as mp:  # a notebook's display, for this call only
        mp.setitem(sys.modules, "IPython", ipython)
        mp.setitem(sys.modules, "IPython.display", ipython.display)
        assert show(ld.example, ld.labels, layers=[1]) is None  # displayed once, nothing returned to display again
    text = shown[0]._repr_html_()
    data = json.loads(re.search(r'id="aa-[0-9a-f]+-data">(.*?)</script>', text, re.S).group(1))
    assert data["layers"] == [1] and data["query_tokens"] == ld.example.tokens


def test_views_import_no_torch():
    code = (
        "import sys, types, attattr_cli, pathlib\n"
        "pkg = types.ModuleType('attattr_cli.cli'); pkg.__path__ = [str(pathlib.Path(attattr_cli.__file__).parent / 'cli')]\n"
        "sys.modules['attattr_cli.cli'] = pkg\n"
        "import attattr_cli.views, attattr_cli.views.report, attattr_cli.views.html, attattr_cli.cli.view, attattr_cli.cli.report\n"
        "print(sorted(m for m in ('torch', 'transformers', 'matplotlib') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


# -- report ----------------------------------------------------------------------------------
def test_report_file_and_folder(stores, tmp_path, monkeypatch):
    r = _ok("report", stores["default"], "-o", tmp_path / "r.html", "-q")
    assert r.stdout.strip() == str(tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    data = json.loads(re.search(r'id="aa-report-data">(.*?)</script>', text, re.S).group(1))
    with Store(stores["default"]) as s:
        assert [row[0] for row in data["rows"]] == s.indices()
        e = s.get(2)
        labels = s.provenance["label_names"]
    row = data["rows"][2]
    assert row[2] == labels[e.gold] and row[3] == labels[e.pred] and row[4] == pytest.approx(e.probs[e.pred], abs=1e-4)
    assert row[5] == pytest.approx(np.abs(e.residual).max(), rel=1e-2)
    assert len(re.findall(r'id="aa-ex-\d+"', text)) == 3
    assert not re.search(r"(src|href)\s*=\s*[\"']?(https?:)?//|url\(\s*[\"']?https?:|@import", text)
    _ok("report", stores["default"], "-o", f"{tmp_path / 'rep'}/", "-q")
    assert sorted(p.name for p in (tmp_path / "rep" / "examples").iterdir()) == [f"{i:08d}.js" for i in range(3)]
    _ok("report", stores["default"], "-o", f"{tmp_path / 'rep'}/", "-q")  # a report folder is replaced whole
    assert len(list((tmp_path / "rep" / "examples").iterdir())) == 3
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    _one_error(_run("report", stores["default"], "-o", tmp_path / "mine"), "holds other files, not an attattr report")
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    from attattr_cli.views import report as report_mod

    monkeypatch.setattr(report_mod, "MAX_SINGLE_FILE", 2)
    _one_error(_run("report", stores["default"], "-o", tmp_path / "big.html"), "too many for one file")
    assert not (tmp_path / "big.html").exists()


def test_report_with_importance(stores, tmp_path):
    imp = tmp_path / "imp.h5"
    _ok("importance", stores["default"], "--out", imp, "-q")
    _ok("report", stores["default"], "--importance", imp, "-o", tmp_path / "r.html", "-q")
    text = (tmp_path / "r.html").read_text()
    data = json.loads(re.search(r'id="aa-report-data">(.*?)</script>', text, re.S).group(1))
    assert {t["name"] for t in data["importance"]["tables"]} >= {"attr", "attention"}
    assert np.shape(data["importance"]["tables"][0]["values"]) == (3, 4)
    other = tmp_path / "other.h5"
    _ok("importance", stores["gpt2"], "--out", other, "-q")
    _one_error(_run("report", stores["default"], "--importance", other, "-o", tmp_path / "r2.html"),
               "was made for another model")
    assert not (tmp_path / "r2.html").exists()


def _report_data(page: str) -> dict:
    return json.loads(re.search(r'id="aa-report-data">(.*?)</script>', page, re.S).group(1))


def test_report_of_generations(stores, tmp_path):
    """A store of generations: one row per prompt with its generated words, steps, foil and the
    largest |residual| of a step and layer, flagged by its steps; each example's page part is
    its step x source matrix and steps (views/steps.py), the same numbers as step_source."""
    from attattr_cli.analysis.aggregate import step_source
    from attattr_cli.views.report import GENERATION_COLUMNS
    from attattr_cli.views.steps import facts

    _ok("report", stores["gen"], "-o", tmp_path / "g.html", "-q")
    page = (tmp_path / "g.html").read_text()
    data = _report_data(page)
    assert data["columns"] == GENERATION_COLUMNS
    assert data["generations"]["examples"] == 2 and data["generations"]["steps"] == 6
    assert data["generations"]["target"] == "log p(token) - log p(w9)"
    with Store(stores["gen"]) as s:
        examples = [s.get(i) for i in s.indices()]
    for row, e in zip(data["rows"], examples):
        got = dict(zip(data["columns"], row))
        targets = [st.meta["step"]["target_token"] for st in e.steps]
        assert got["prompt"] == e.text_a and got["generated"].split() == targets and got["steps"] == 3
        assert got["foil"] == "w9" and got["tokens"] == len(e.tokens)
        worst = max(float(np.abs(st.residual).max()) for st in e.steps)
        assert got["max |step residual|"] == pytest.approx(worst, rel=1e-2)
        assert ("unconverged" in got["flags"]) == any(not st.converged for st in e.steps)
        assert "wrong" not in got["flags"]
        part = json.loads(re.search(rf'id="aa-ex-{e.index}">(.*?)</script>', page, re.S).group(1))
        assert set(part) == {"steps_html"}
        m, rows, cols, _f, _l = step_source(e, words=True)
        svg = re.search(r'<svg[^>]*aa-step-matrix.*?</svg>', part["steps_html"], re.S).group(0)
        tips = [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg)]
        assert len(tips) == m.size  # one cell per generated word and source, each with its value
        from attattr_cli.views.data import format_number

        for (i, j), v in np.ndenumerate(m):
            want = format_number(v, signed=True) if np.isfinite(v) else "not in the step's prefix"
            assert tips[i * m.shape[1] + j].endswith(f": {want}")
        assert facts(e)["generated"] in part["steps_html"]
    bare = strip_scripts(page)  # without script: the table of generations
    assert "2 generations scored step by step, 6 steps in all" in bare
    assert all(f">{dict(zip(data['columns'], r))['generated']}<" in bare for r in data["rows"])
    _ok("report", stores["default"], "-o", tmp_path / "d.html", "-q")  # a store of classified examples keeps its columns
    assert _report_data((tmp_path / "d.html").read_text())["columns"][:5] == ["index", "text", "gold", "prediction",
                                                                             "probability"]


# -- fixes of the older figures ----------------------------------------------------------------
def test_tree_dot_has_legend_and_prediction(stores):
    from attattr_cli.analysis.tree import tree_for_example, tree_to_dot

    g = tree_for_example(_get(stores["default"]).example)
    dot = tree_to_dot(g, prediction="neutral (p 0.998)")
    assert "\\nneutral (p 0.998)\\n" in dot and '"legend"' in dot and "top node</TD>" in dot
    assert "legend" not in tree_to_dot(g, legend=False)


def test_importance_figure_all_random_tables_no_overlap():
    from attattr_cli.analysis.importance import Table
    from attattr_cli.analysis.plots import importance_figure, short_title

    rng = np.random.default_rng(0)
    tables = [Table("attr", "attr", rng.random((3, 4)), [], None, "", "")] + [
        Table(f"random-{s}", "random", rng.random((3, 4)), [], s, "", "") for s in range(3)]
    fig = importance_figure(tables, title="/some/where/default_model")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    panels = [ax for ax in fig.axes if ax.get_label() != "<colorbar>" and ax.get_visible()]
    bars = [ax for ax in fig.axes if ax.get_label() == "<colorbar>"]
    assert [ax.get_title() for ax in panels] == ["attribution", "random (seed 0)", "random (seed 1)", "random (seed 2)"]
    assert len(bars) == 4 and fig._suptitle.get_text() == "default_model"
    for bar, nxt in zip(bars, panels[1:]):  # each colour bar (with its labels) ends before the next panel's labels
        assert bar.get_tightbbox(renderer).x1 <= nxt.get_tightbbox(renderer).x0
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert short_title("attattr/synthetic-nli-bert on /data/x/dev.tsv") == "attattr/synthetic-nli-bert on dev.tsv"


# -- the real browser --------------------------------------------------------------------------
needs_chromium = pytest.mark.skipif(find_chromium() is None, reason="chromium is not installed (just setup installs it as root)")


def _cells(page):
    return page.eval("Array.from(document.querySelectorAll('.aa-grid')[0].querySelectorAll('.aa-cell'))"
                     ".map(c => c.style.background).join('|')")


def _not_blank(png: bytes) -> None:
    import matplotlib.image as mpimg

    img = mpimg.imread(io.BytesIO(png), format="png")
    assert img.shape[0] > 300 and img.shape[1] > 300
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 50  # colours, not a blank page


@needs_chromium
def test_view_in_chromium(stores, tmp_path):
    page_file = tmp_path / "v.html"
    _ok("view", stores["default"], "-n", "0", "-o", page_file, "-q")
    gpt2_file = tmp_path / "g.html"
    _ok("view", stores["gpt2"], "-n", "0", "-o", gpt2_file, "-q")
    cross_file = tmp_path / "c.html"
    _ok("view", stores["bart"], "-n", "0", "--family", "cross", "-o", cross_file, "-q")
    e = _get(stores["default"]).example
    with Chromium() as b:
        p = b.open(page_file.as_uri())
        dom_tokens = p.eval("Array.from(document.querySelectorAll('.aa-tok')).map(t => t.textContent)")
        assert dom_tokens == e.tokens
        n = len(e.tokens)
        assert p.eval("document.querySelectorAll('.aa-cell').length") == 2 * n * n  # attribution and attention
        before = _cells(p)
        p.eval("var s = document.querySelector('.aa-layer'); s.value = (+s.value + 1) % 3; s.dispatchEvent(new Event('change')); 1")
        assert _cells(p) != before
        p.eval("var s = document.querySelector('.aa-head'); s.value = 2; s.dispatchEvent(new Event('change')); 1")
        assert p.eval("document.querySelector('.aa-head').options.length") == 5  # sum + 4 heads
        p.eval("document.querySelector('button[data-kind=attention]').click(); 1")
        assert p.eval("document.querySelectorAll('.aa-grid')[1].offsetParent === null")  # one map shown
        p.eval("document.querySelectorAll('.aa-tok')[2].click(); 1")
        reads = p.eval("document.querySelector('.aa-reads').textContent")
        assert f"{e.tokens[2]} (2) reads from" in reads and "is read by" in reads
        p.eval("var c = document.querySelectorAll('.aa-cell')[5]; var r = c.getBoundingClientRect();"
               "c.dispatchEvent(new MouseEvent('mousemove', {bubbles: true, clientX: r.x + 2, clientY: r.y + 2})); 1")
        tip = p.eval("document.querySelector('.aa-tip').textContent")
        assert tip.startswith(f"{e.tokens[0]} (0) → {e.tokens[5]} (5): attention")
        _not_blank(p.screenshot())
        assert p.errors() == []
        assert p.requests() == [page_file.as_uri()]
        g = b.open(gpt2_file.as_uri())
        n = len(_get(stores["gpt2"]).example.tokens)
        assert g.eval("document.querySelectorAll('.aa-grid')[0].querySelectorAll('.aa-masked').length") == n * (n - 1) // 2
        assert g.errors() == []
        c = b.open(cross_file.as_uri())  # cross: decoder queries, input keys; a click picks one side
        cross = _get(stores["bart"], family="cross").example
        c.eval("document.querySelector('.aa-row-label[data-pos=\"0\"]').click(); 1")
        reads = c.eval("document.querySelector('.aa-reads').textContent")
        assert reads.startswith(f"{cross.tokens[0]} (0) reads from") and "is read by" not in reads
        c.eval("document.querySelector('.aa-col-label[data-pos=\"0\"]').click(); 1")
        reads = c.eval("document.querySelector('.aa-reads').textContent")
        assert reads.startswith(f"{cross.key_tokens[0]} (0) is read by") and "reads from" not in reads
        assert c.errors() == []


@needs_chromium
def test_report_in_chromium(stores, tmp_path):
    _ok("report", stores["default"], "-o", f"{tmp_path / 'rep'}/", "-q")
    _ok("report", stores["default"], "-o", tmp_path / "one.html", "-q")
    with Chromium() as b:
        for url in ((tmp_path / "rep" / "index.html").as_uri(), (tmp_path / "one.html").as_uri()):
            p = b.open(url)
            assert p.eval("document.querySelectorAll('tr.aa-row').length") == 3
            order = "Array.from(document.querySelectorAll('tr.aa-row')).map(r => +r.dataset.index)"
            p.eval("document.querySelectorAll('table.aa-rows th')[0].click(); 1")  # sorted by index: reversed
            assert p.eval(order) == [2, 1, 0]
            p.eval("document.querySelectorAll('table.aa-rows th')[0].click(); 1")
            assert p.eval(order) == [0, 1, 2]
            p.eval("document.querySelectorAll('table.aa-rows th')[4].click(); 1")  # by probability, ascending
            with Store(stores["default"]) as s:
                probs = [float(s.get(i).probs[s.get(i).pred]) for i in s.indices()]
            assert p.eval(order) == sorted(range(3), key=lambda i: probs[i])
            p.eval("var f = document.querySelector('.aa-filter'); f.value = '1'; f.dispatchEvent(new Event('input')); 1")
            p.settle(0.4)
            shown = p.eval("Array.from(document.querySelectorAll('tr.aa-row')).map(r => +r.dataset.index)")
            assert 1 in shown
            p.eval("document.querySelector('tr.aa-row[data-index=\"1\"]').click(); 1")
            p.settle(0.4)
            assert p.eval("document.querySelector('.aa-overlay [data-shown]').getAttribute('data-shown')") == "1"
            assert p.eval("document.querySelectorAll('.aa-overlay .aa-cell').length") > 0
            _not_blank(p.screenshot())
            assert p.errors() == []
            assert all(u.startswith("file://") for u in p.requests())


@needs_chromium
def test_report_of_generations_in_chromium(stores, tmp_path):
    _ok("report", stores["gen"], "-o", f"{tmp_path / 'rep'}/", "-q")
    _ok("report", stores["gen"], "-o", tmp_path / "one.html", "-q")
    data = _report_data((tmp_path / "one.html").read_text())
    worst = data["columns"].index("max |step residual|")
    with Store(stores["gen"]) as s:
        e = s.get(1)
    from attattr_cli.analysis.aggregate import step_source

    m = step_source(e, words=True)[0]
    with Chromium() as b:
        for url in ((tmp_path / "rep" / "index.html").as_uri(), (tmp_path / "one.html").as_uri()):
            p = b.open(url)
            assert p.eval("Array.from(document.querySelectorAll('table.aa-rows th')).map(t => t.textContent)"
                          ".map(t => t.replace(/ [▲▼]$/, ''))") == data["columns"]
            assert p.eval("Array.from(document.querySelectorAll('.aa-flag-filter option')).map(o => o.value)") == [
                "", "residual", "truncated", "unconverged"]  # no wrong prediction in a generation
            cells = p.eval("Array.from(document.querySelectorAll('tr.aa-row')[1].children).map(c => c.textContent)")
            assert cells[2] == data["rows"][1][2] and cells[3] == "3"  # generated words, steps
            order = "Array.from(document.querySelectorAll('tr.aa-row')).map(r => +r.dataset.index)"
            p.eval(f"document.querySelectorAll('table.aa-rows th')[{worst}].click(); 1")  # by the worst step, ascending
            assert p.eval(order) == sorted([0, 1], key=lambda i: data["rows"][i][worst])
            p.eval(f"var f = document.querySelector('.aa-filter'); f.value = {json.dumps(data['rows'][1][2])};"
                   " f.dispatchEvent(new Event('input')); 1")  # the filter reads the generated text
            p.settle(0.4)
            assert 1 in p.eval(order)
            p.eval("document.querySelector('tr.aa-row[data-index=\"1\"]').click(); 1")
            p.settle(0.4)
            assert p.eval("document.querySelector('.aa-overlay [data-shown]').getAttribute('data-shown')") == "1"
            assert p.eval("document.querySelector('.aa-overlay svg.aa-step-matrix').querySelectorAll('rect title')"
                          ".length") == m.size
            assert p.eval("document.querySelectorAll('.aa-overlay table.aa-step-table > tbody > tr').length") == 4  # head + 3 steps
            png = p.screenshot()
            assert painted_colours(p, png, ".aa-overlay svg.aa-step-matrix") > 5  # the matrix is painted
            assert p.errors() == []
            assert all(u.startswith("file://") for u in p.requests())


CELLS = "svg.aa-still-map g[shape-rendering]"  # the cells of the still heatmaps


@needs_chromium
def test_views_without_scripts_in_chromium(stores, tmp_path):
    """With every <script> removed (an untrusted notebook, GitHub's preview) the view page, two
    notebook displays of one view and the report still show their heatmaps and coloured tokens;
    with scripts, the script replaces the still picture and the two displays do not collide."""
    ld = _get(stores["default"], 1)
    e = ld.example
    _ok("view", stores["default"], "-n", "1", "-o", tmp_path / "v.html", "-q")
    twice = f"<!DOCTYPE html><html><body>{example_html(e, ld.labels)}{example_html(e, ld.labels)}</body></html>"
    (tmp_path / "nb.html").write_text(twice)
    one = example_html(e, ld.labels)  # one display stored twice (same text, same ids), each in its output box
    (tmp_path / "same.html").write_text(f"<!DOCTYPE html><html><body><div>{one}</div><div>{one}</div></body></html>")
    imp = tmp_path / "imp.h5"
    _ok("importance", stores["default"], "--out", imp, "-q")
    _ok("report", stores["default"], "--importance", imp, "-o", tmp_path / "r.html", "-q")
    for name in ("v", "nb", "r"):
        bare = strip_scripts((tmp_path / f"{name}.html").read_text())
        assert "<script" not in bare
        (tmp_path / f"{name}-bare.html").write_text(bare)
    n = len(e.tokens)
    with Chromium() as b:
        for name, displays in (("v", 1), ("nb", 2)):
            p = b.open((tmp_path / f"{name}-bare.html").as_uri())
            assert p.eval("document.querySelectorAll('.aa-grid').length") == 0  # no script ran
            assert p.eval("document.querySelectorAll('svg.aa-still-map').length") == 2 * displays  # attr, attention
            labels = p.eval("Array.from(document.querySelector('svg.aa-still-map').querySelectorAll('text'))"
                            ".map(t => t.textContent)")
            assert labels[-n:] == e.tokens  # the query labels, in order
            tokens = p.eval("Array.from(document.querySelectorAll('.aa-highlight span')).map(s => s.textContent)")
            assert tokens == e.tokens * displays
            png = p.screenshot()
            _not_blank(png)
            assert painted_colours(p, png, CELLS) > 10  # the heatmaps are painted, not blank
            assert p.eval("document.querySelectorAll('.aa-tree svg').length") == displays
            assert p.errors() == []
            s = b.open((tmp_path / f"{name}.html").as_uri())
            assert s.eval("document.querySelectorAll('.aa-still').length") == 0  # replaced by the script
            assert s.eval("document.querySelectorAll('.aa-grid').length") == 2 * displays
            assert s.eval("Array.from(document.querySelectorAll('.aa-grid')).every(g => g.querySelectorAll('.aa-cell')"
                          f".length === {n * n})")
            assert s.errors() == []
        # the script reads the packed maps to the same numbers as Python; NaN and infinities as null
        from attattr_cli.views.data import pack, unpack

        page = (tmp_path / "v.html").read_text()
        packed = json.loads(re.search(r'id="aa-data">(.*?)</script>', page, re.S).group(1))["maps"]["attr"]
        js = np.array(s.eval(f"AttattrView.unpack({json.dumps(packed)})"), dtype=np.float64)
        assert js.shape == tuple(packed["shape"]) and np.array_equal(js, unpack(packed))
        odd = pack([[1.5, -2.0e-6, float("nan"), float("inf")]])
        assert s.eval(f"AttattrView.unpack({json.dumps(odd)})") == [[1.5, pytest.approx(-2.0e-6, rel=1e-3), None, None]]
        same = b.open((tmp_path / "same.html").as_uri())  # both copies drawn, neither left blank
        assert same.eval("document.querySelectorAll('.aa-still').length") == 0
        assert same.eval("Array.from(document.body.children).map(d => d.querySelectorAll('.aa-grid').length)") == [2, 2]
        assert same.errors() == []
        p = b.open((tmp_path / "r-bare.html").as_uri())
        assert p.eval("document.querySelectorAll('.aa-still table tr').length") == 4  # header and 3 rows
        png = p.screenshot()
        assert painted_colours(p, png, "svg.aa-still-map") > 10  # head importance grids
        s = b.open((tmp_path / "r.html").as_uri())
        assert s.eval("document.querySelectorAll('.aa-still').length") == 0
        assert s.eval("document.querySelectorAll('tr.aa-row').length") == 3
        assert p.errors() == [] and s.errors() == []


def test_still_picture_is_the_scripts_picture(stores):
    """The still heatmap's cells carry view.js's colours (to one of 40 steps) of the packed maps,
    and the packed maps are the view's maps to float16 precision."""
    from attattr_cli.views.html import view_data
    from attattr_cli.views.colours import LEVELS, cell_colour
    from attattr_cli.views.data import unpack
    from attattr_cli.views.still import shared_scale, view_still

    ld = _get(stores["default"], 1)
    data = view_data(ld.example, ld.labels)
    attr = unpack(data["maps"]["attr"])
    want = np.concatenate([ld.example.attribution.sum(axis=1)[:, None], ld.example.attribution], axis=1)
    np.testing.assert_allclose(attr, want, rtol=2e-3, atol=np.abs(want).max() * 2e-4)
    assert len(data["maps"]["attr"]["f16"]) < 3 * attr.size  # about 2.7 characters a value
    still = view_still(data)
    layer, top = data["initial"]["layer"], shared_scale(attr, data["heads"], 0, None)
    svg = re.search(r'<svg[^>]*data-kind="attr".*?</svg>', still, re.S).group(0)
    drawn = {}
    for colour, d in re.findall(r'<path stroke="(#[0-9a-f]{6})" d="([^"]+)"', svg):
        for j, i, run in re.findall(r"M(\d+) (\d+)\.5h(\d+)", d):
            for k in range(int(run)):
                drawn[int(i), int(j) + k] = colour
    n = len(ld.example.tokens)
    assert len(drawn) == n * n
    assert all(drawn[i, j] == cell_colour("attr", attr[layer, 0, i, j], top) for i in range(n) for j in range(n))
    v = attr[layer, 0]
    i, j = np.unravel_index(np.argmax(np.abs(v)), v.shape)
    assert drawn[i, j] == cell_colour("attr", np.sign(v[i, j]) * top, top) != "#ffffff" and LEVELS == 40


def test_report_draws_every_row_with_a_nan_and_a_text_holding_its_placeholder(stores, tmp_path):
    """A non-finite example once put a bare NaN into the page's JSON (no row drawn), and a text
    holding the template's placeholder was spliced into its own data."""
    import shutil

    import h5py

    store = tmp_path / "odd.h5"
    shutil.copy(stores["default"], store)
    with h5py.File(store, "a") as f:
        g = f["examples"]["00000001"]
        g.attrs["text_a"] = "a text with %EXAMPLES% in it"
        g["residual"][0] = float("nan")
        g.attrs["nonfinite"] = "attribution"
    _ok("report", store, "-o", f"{tmp_path / 'rep'}/", "-q")
    _ok("report", store, "-o", tmp_path / "one.html", "-q")
    page = (tmp_path / "one.html").read_text()
    assert "NaN" not in page.split('id="aa-report-data">')[1].split("</script>")[0]
    with Chromium() as b:
        for url in ((tmp_path / "rep" / "index.html").as_uri(), (tmp_path / "one.html").as_uri()):
            p = b.open(url)
            assert p.eval("document.querySelectorAll('tr.aa-row').length") == 3
            assert "%EXAMPLES%" in p.eval("document.querySelector('table.aa-rows').textContent")
            assert p.errors() == []


VALUES = [6.19e-4, 0.0579, 0.63, 3.988e-7, 4e-7, -0.018, 12345.6, 1.0, 0.5, 100.0, 0.001, -2.5e-5, 0.0, 9.996]


def test_one_number_format_in_python_and_in_the_page(stores, tmp_path):
    """Residuals and errors read the same in the PNG/SVG (Python) and the HTML (view.js)."""
    from attattr_cli.views.data import format_number

    assert [format_number(v) for v in (6.19e-4, 0.0579, 0.63, 3.988e-7)] == ["6.19e-4", "0.0579", "0.63", "3.99e-7"]
    assert format_number(4e-7, signed=True) == "+4e-7" and format_number(-0.018, signed=True) == "-0.018"
    _ok("report", stores["default"], "-o", tmp_path / "one.html", "-q")
    with Chromium() as b:
        p = b.open((tmp_path / "one.html").as_uri())
        js = p.eval(f"{json.dumps(VALUES)}.map(function (v) {{ return AttattrView.fmt(v, true); }})")
    assert js == [format_number(v, signed=True) for v in VALUES]


def test_all_heads_of_one_layer_are_drawn_as_a_grid(stores, tmp_path):
    out = tmp_path / "heads.svg"
    _ok("view", stores["default"], "--example", "0", "--layers", "1", "--heads", "all", "-o", out)
    head = out.read_text()[:2000]
    width, height = (float(x) for x in re.search(r'width="([\d.]+)pt" height="([\d.]+)pt"', head).groups())
    assert width > height / 2, (width, height)  # 4 heads x (attribution, attention): 2 rows of 4, not 8 rows of 1
