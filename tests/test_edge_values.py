"""Edge values are refused before anything loads (one line, nothing written), and every JSON
attattr prints or writes is strict: no NaN or Infinity, which JSON.parse and other strict
readers refuse (attattr_cli/fileio.py, ``dumps``)."""

from __future__ import annotations

import json
import re
import shutil

import h5py
import numpy as np
import pytest

from conftest import one_error_line, run_cli


def _strict(text: str):
    """json.loads that refuses NaN and Infinity, as JSON.parse does."""
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")
    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    out = tmp_path_factory.mktemp("edge") / "s.h5"
    r = run_cli("score", "--out", out, "--examples", "0:2", "--steps", 2, "-q")
    assert r.exit_code == 0, r.output
    return out


@pytest.mark.parametrize("command", ["faithfulness", "importance", "prune"])
@pytest.mark.parametrize("methods", ["", " , "])
def test_empty_methods_are_refused(store, tmp_path, command, methods):
    out = tmp_path / ("o.h5" if command == "importance" else "o.json")
    args = {"faithfulness": [store], "importance": [store], "prune": ["--importance", store]}[command]
    one_error_line(run_cli(command, *args, "--out", out, "--methods", methods), "--methods is empty")
    assert not out.exists()


@pytest.mark.parametrize("command", ["score", "triggers", "faithfulness"])
@pytest.mark.parametrize("tol", ["inf", "-inf", "nan", "0", "-1"])
def test_tol_non_finite_or_not_positive_is_refused(tmp_path, command, tol):
    out = tmp_path / ("o.h5" if command == "score" else "o.json")
    one_error_line(run_cli(command, "--out", out, "--tol", tol, "--examples", "0:1"),
                   "--tol must be a finite number > 0")
    assert not any(tmp_path.iterdir())


def test_printed_and_written_json_is_strict_for_an_old_store_with_infinity(store, tmp_path):
    """A store whose recorded options hold Infinity (written before --tol inf was refused):
    info --json, the report page's data and the importance --json rows stay strict JSON."""
    old = tmp_path / "old.h5"
    shutil.copyfile(store, old)
    with h5py.File(old, "r+") as f:
        opts = json.loads(f["provenance"].attrs["options"])
        f["provenance"].attrs["options"] = json.dumps(dict(opts, tol=float("inf"), max_nodes=float("nan")))
    info = run_cli("info", old, "--json")
    assert info.exit_code == 0, info.output
    doc = _strict(info.stdout)
    assert doc["provenance"]["options"]["tol"] is None
    report = tmp_path / "r.html"
    r = run_cli("report", old, "-o", report)
    assert r.exit_code == 0, r.output
    page = report.read_text()
    assert not re.search(r"\b(NaN|-?Infinity)\b", " ".join(re.findall(r"<script[^>]*json[^>]*>(.*?)</script>", page,
                                                                          re.S)))
    rows = run_cli("importance", old, "--out", tmp_path / "i.h5", "--methods", "attr", "--json", "-q")
    assert rows.exit_code == 0, rows.output
    _strict(rows.stdout)


# -- questions with no answer and values that only look right -------------------------------------
@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory, tokenizer):
    import torch

    from conftest import build_model

    folder = tmp_path_factory.mktemp("lm") / "tiny-llama"
    build_model("llama", torch.float32, num_labels=2, layers=2, lm=True).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("text", ["   ", "\t \n"])
def test_a_text_with_no_tokens_is_refused(store, tmp_path, text):
    """WordPiece turns whitespace into no tokens at all: one line, nothing written (the store
    resumed keeps what it held)."""
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps({"text_a": "w1 w2", "text_b": text}) + "\n")
    out = tmp_path / "s.h5"
    shutil.copyfile(store, out)
    before = out.read_bytes()
    from attattr_cli.models.default import DEFAULT_MODEL_DIR

    one_error_line(run_cli("score", "--out", out, "--data", data, "--model", DEFAULT_MODEL_DIR,
                           "--steps", 2, "-q"), "example 0", "text_b", "gives no tokens")
    assert out.read_bytes() == before
    import attattr_cli as aa
    from attattr_cli.errors import DataError

    with pytest.raises(DataError, match="text_a '   ' gives no tokens"):
        aa.score(None, ["   "], steps=2)


def test_a_whitespace_prompt_of_a_language_model_is_refused(llama_dir, tmp_path):
    out = tmp_path / "g.h5"
    one_error_line(run_cli("score", "--lm", "--model", llama_dir, "--prompt", "  ", "--steps", 2, "--out", out),
                   "example 0", "prompt", "gives no tokens")
    assert not out.exists()


@pytest.mark.parametrize("args, said", [
    (["--target", "neutral", "--foil", "neutral"], "--foil 'neutral' is the --target class itself"),
    (["--target", "1", "--foil", "NEUTRAL"], "--foil 'NEUTRAL' is the --target class itself"),
    (["--foil", "²"], "unknown --foil class '²'"),
    (["--target", "٣"], "unknown target '٣'"),
    (["--target", "²"], "unknown target '²'"),
])
def test_a_foil_equal_to_the_target_or_a_unicode_digit_is_one_line(store, tmp_path, args, said):
    out = tmp_path / "s.h5"
    shutil.copyfile(store, out)
    before = out.read_bytes()
    line = one_error_line(run_cli("score", "--out", out, "--examples", "0:3", "--steps", 2, "-q", *args), said)
    assert run_cli("score", "--out", out, "--examples", "0:3", "--steps", 2, "-q", *args).exit_code == 2, line
    assert out.read_bytes() == before


def test_a_foil_equal_to_the_target_token_is_refused_and_a_generated_foil_is_said(llama_dir, tmp_path):
    out = tmp_path / "g.h5"
    one_error_line(run_cli("score", "--lm", "--model", llama_dir, "--prompt", "w1 w2", "--target-token", "w3",
                           "--foil", "w3", "--steps", 2, "--out", out), "--foil 'w3' is the target token itself")
    assert not out.exists()
    import attattr_cli as aa

    model = aa.load_model(str(llama_dir), lm=True)
    generated = aa.score(model, ["w1 w2 w3"], generate=3, steps=2)[0]
    foil = model.tokenizer.convert_ids_to_tokens([generated.steps[1].target])[0]
    with pytest.warns(UserWarning, match="example 0: step 1's token is the foil") as said:
        again = aa.score(model, ["w1 w2 w3"], generate=3, steps=2, foil=foil)[0]
    assert np.abs(again.steps[1].attribution).max() == 0  # the degenerate step, said, not hidden
    assert [st.target for st in again.steps] == [st.target for st in generated.steps]  # the same generation
    assert sum("is the foil" in str(w.message) for w in said) == sum(st.target == again.steps[1].target
                                                                     for st in again.steps)


@pytest.fixture(scope="module")
def scored_example():
    import attattr_cli as aa

    return aa.score(None, examples="0:1", steps=2)[0]


@pytest.mark.parametrize("spans, said", [
    ([(0, 2), "ab"], "a span is (start, end), two whole numbers, got 'ab'"),
    ([(0, 2.7)], "got (0, 2.7)"),
    ([(True, 2)], "got (True, 2)"),
    ([(0, 1, 2)], "got (0, 1, 2)"),
    (5, "a list of (start, end) spans"),
])
def test_spans_are_pairs_of_whole_numbers(scored_example, spans, said):
    from attattr_cli.errors import OptionError

    e = scored_example
    with pytest.raises(OptionError) as caught:
        e.aggregate(spans)
    assert said in str(caught.value)
    for whole in ([(1, 3)], [(np.int64(1), np.int64(3))]):  # whole numbers, numpy's too
        assert len(e.aggregate(whole).tokens) == len(e.tokens) - 1


def test_one_example_is_said_in_the_singular(tmp_path):
    r = run_cli("score", "--out", tmp_path / "s.h5", "--examples", "0:1", "--steps", 2)
    assert r.exit_code == 0 and "scored 1 example (0 already in the store)" in r.stderr, r.output


def test_faithfulness_prints_its_table_without_out(store, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = run_cli("faithfulness", store, "--csv", "--methods", "attr", "--permutations", 0, "-q")
    assert r.exit_code == 0, r.output
    assert r.stdout.splitlines()[0].startswith("section,method,tau_loo") and "attr" in r.stdout
    assert list(tmp_path.iterdir()) == []  # no report, no store written
    one_error_line(run_cli("faithfulness", store, "--methods", "attr", "--permutations", 0, "-q"),
                   "give --out", "--json or --csv")
