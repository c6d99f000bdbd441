"""`attattr import-json`: hand-made files in the 2021 code's formats into a store, and back out as trees."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from attattr_cli.analysis.legacy import infer_labels, read_matrices, segment_ids_of
from attattr_cli.errors import DataError
from attattr_cli.store import Store
from conftest import one_error_line, run_cli


TOKENS = {
    0: ["[CLS]", "the", "cat", "[SEP]", "a", "pet", "[SEP]"],
    1: ["[CLS]", "no", "dog", "##s", "[SEP]", "a", "[SEP]"],
}
LABELS_2021 = ["contradiction", "entailment", "neutral"]  # the 2021 MnliProcessor's order


def _attr(index: int, layers: int = 3, heads: int = 2) -> np.ndarray:
    rng = np.random.default_rng(index)
    n = len(TOKENS[index])
    return np.round(rng.normal(size=(layers, heads, n, n)), 4)


def _write_attr(path, arr):
    # one [heads][n][n] list per line, as generate_attrscore.py writes it
    path.write_text("".join(json.dumps(layer.tolist()) + "\n" for layer in arr))
    return path


@pytest.fixture
def files(tmp_path):
    entries = [
        {"index": 0, "tokens": TOKENS[0], "pred": "entailment", "golden": "entailment",
         "pred_logits": [[-1.0, 2.5, 0.1]]},
        {"index": 1, "tokens": TOKENS[1], "pred": "contradiction", "golden": "neutral",
         "pred_logits": [[3.0, -0.5, 0.2]]},
    ]
    tokens = tmp_path / "tokens_and_pred_2.json"
    tokens.write_text(json.dumps(entries, indent=2) + "\n")  # as get_tokens_and_pred.py writes it
    a1 = _write_attr(tmp_path / "attr_zero_base_exp1.json", _attr(1))
    a0 = _write_attr(tmp_path / "attr_zero_base_exp0.json", _attr(0))
    att = _write_attr(tmp_path / "att_score_zero_base_exp1.json", np.abs(_attr(1)) / 10)
    return {"tokens": tokens, "a0": a0, "a1": a1, "att1": att, "dir": tmp_path}


def test_import_round_trip_and_tree(files):
    out = files["dir"] / "imported.h5"
    result = run_cli("import-json", files["a1"], files["tokens"], "--out", out, "--model", "bert-base-cased-mnli")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == str(out)
    assert "imported example 1 (7 tokens, 3 layers x 2 heads" in result.stderr
    with Store(out) as s:
        assert s.indices() == [1]
        e = s.get(1)
        np.testing.assert_allclose(e.attribution, _attr(1), rtol=1e-6)
        assert e.tokens == TOKENS[1]
        assert e.attention.shape == (0, 0, 7, 7)
        assert e.segment_ids.tolist() == [-1, 0, 0, 0, -1, 1, -1]
        assert e.text_a == "no dogs" and e.text_b == "a"
        assert e.layers == [0, 1, 2]
        assert np.isnan(e.residual).all() and np.isnan(e.f_baseline).all()
        assert (e.input_ids == -1).all()
        prov = s.provenance
        assert prov["model_source"] == "import-2021" and prov["model"] == "bert-base-cased-mnli"
        assert prov["label_names"] == LABELS_2021 and prov["label_mapping"] == "inferred"
        assert e.pred == 0 and e.gold == 2 and e.target == 0
        assert e.f_full == pytest.approx(float(np.exp(3.0) / np.exp([3.0, -0.5, 0.2]).sum()))
        assert e.meta["attribution_sha256"] == hashlib.sha256(files["a1"].read_bytes()).hexdigest()
        np.testing.assert_allclose(e.head_max, _attr(1).reshape(3, 2, -1).max(-1), rtol=1e-6)
        assert s.fingerprint["data_sha256"] == hashlib.sha256(files["tokens"].read_bytes()).hexdigest()
        s.summary()  # readable by `attattr info`
    tree = run_cli("tree", out, "--example", 1, "--compat", "reference", "--format", "json")
    assert tree.exit_code == 0, tree.output
    data = json.loads(tree.stdout)
    assert data["tokens"] == TOKENS[1] and data["mode"] == "reference"
    assert run_cli("info", out).exit_code == 0


def test_more_examples_join_the_store(files):
    out = files["dir"] / "s.h5"
    assert run_cli("import-json", files["a1"], files["tokens"], "-o", out, "--attention", files["att1"]).exit_code == 0
    # a file without the expN name needs --example
    plain = files["a0"].rename(files["dir"] / "scores.jsonl")
    one_error_line(run_cli("import-json", plain, files["tokens"], "-o", out), "give --example")
    again = run_cli("import-json", plain, files["tokens"], "-o", out, "--example", 0)
    assert again.exit_code == 0, again.output
    with Store(out) as s:
        assert s.indices() == [0, 1]
        np.testing.assert_allclose(s.get(1).attention, np.abs(_attr(1)) / 10, rtol=1e-6)
        assert s.get(0).attention.shape == (0, 0, 7, 7)
        assert len(s.provenance["runs"]) == 2  # the refused call wrote nothing
    same = run_cli("import-json", files["a1"], files["tokens"], "-o", out)
    assert same.exit_code == 0 and "already in" in same.stderr


def test_bad_files_are_one_line_errors(files):
    d, tok = files["dir"], files["tokens"]
    out = d / "s.h5"
    one_error_line(run_cli("import-json", d / "nothing.json", tok, "-o", out), "nothing.json: no such file")
    bad = d / "attr_zero_base_exp1_bad.json"
    bad.write_text(json.dumps(_attr(1)[0].tolist()) + "\n{not json\n")
    one_error_line(run_cli("import-json", bad, tok, "-o", out), "line 2: not JSON")
    bad.write_text("[[[1, 2], [3]]]\n")
    one_error_line(run_cli("import-json", bad, tok, "-o", out), "line 1: not a [heads][n][n] list of numbers")
    bad.write_text("[[1, 2], [3, 4]]\n")
    one_error_line(run_cli("import-json", bad, tok, "-o", out), "expected a [heads][n][n] list, got shape [2, 2]")
    short = _write_attr(d / "attr_zero_base_exp0_short.json", _attr(1)[:, :, :5, :5])
    one_error_line(run_cli("import-json", short, tok, "-o", out), "is 5 x 5 per head but example 0")
    far = _write_attr(d / "attr_zero_base_exp16.json", _attr(1))
    one_error_line(run_cli("import-json", far, tok, "-o", out), "has no example with index 16 (it holds 2 examples: 0..1)")
    broken = d / "tokens.json"
    broken.write_text('[{"index": 0, "toks": []}]')
    one_error_line(run_cli("import-json", files["a1"], broken, "-o", out), "entry 0: expected an object with \"tokens\"")
    one_error_line(run_cli("import-json", files["a1"], tok, "-o", out, "--labels", "yes,no"), "label 'contradiction'")
    one_error_line(run_cli("import-json", files["a1"], tok, "-o", out, "--attention", short),
                   "attr_zero_base_exp0_short.json has shape [3, 2, 5, 5] per file but the attribution has 2 heads of 7 x 7")
    assert not out.exists()


def test_store_from_other_files_is_refused_untouched(files):
    out = files["dir"] / "s.h5"
    assert run_cli("import-json", files["a1"], files["tokens"], "-o", out, "-m", "x").exit_code == 0
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    one_error_line(run_cli("import-json", files["a0"], files["tokens"], "-o", out, "-m", "y"), "model='x' there, 'y' here")
    other = files["dir"] / "tokens_other.json"
    other.write_text(json.dumps([{"index": 0, "tokens": TOKENS[0]}]))
    one_error_line(run_cli("import-json", files["a0"], other, "-o", out, "-m", "x"), "was made from other data")
    assert hashlib.sha256(out.read_bytes()).hexdigest() == digest


def test_helpers():
    assert segment_ids_of(["[CLS]", "a", "[SEP]"]).tolist() == [-1, 0, -1]
    entries = [{"tokens": [], "pred": "b", "pred_logits": [[0, 1]]}, {"tokens": [], "golden": "a"}]
    assert infer_labels(entries) == (["a", "b"], "inferred")
    assert infer_labels([{"tokens": [], "pred": "x"}, {"tokens": [], "golden": "w"}]) == (["w", "x"], "inferred")
    clash = [{"tokens": [], "pred": "a", "pred_logits": [[0, 1]]}, {"tokens": [], "pred": "b", "pred_logits": [[0, 1]]}]
    with pytest.raises(DataError, match="give --labels"):
        infer_labels(clash)


def test_json_lines_tokens_file(tmp_path):
    tok = tmp_path / "tokens.jsonl"
    tok.write_text("\n".join(json.dumps({"index": i, "tokens": TOKENS[i]}) for i in (0, 1)) + "\n")
    attr = _write_attr(tmp_path / "attr_zero_base_exp0.json", _attr(0, layers=2))
    out = tmp_path / "s.h5"
    result = run_cli("import-json", attr, tok, "-o", out)
    assert result.exit_code == 0, result.output
    with Store(out) as s:
        e = s.get(0)
        assert e.gold == -1 and e.pred == -1 and s.provenance["model"] == "unknown"
    assert read_matrices(attr).shape == (2, 2, 7, 7)
