"""One path through the library: options checked before anything loads (by the one validator
the CLI and the API share), one set of names, misuse from Python as AttattrErrors, and the
open edges of the data and the store (one `Error:` line, nothing written)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import attattr_cli.api as aa
from attattr_cli.cli import app
from attattr_cli.errors import AttattrError, OptionError

REPO = Path(__file__).resolve().parents[1]
from test_startup import RUNNER  # noqa: E402  (runs `attattr ARGS` and reports the heavy modules imported)


@pytest.mark.parametrize("args,message", [
    (["--examples", "0-10"], "'0-10' is neither an index"),
    (["--rule", "gaus"], "unknown rule 'gaus'"),
    (["--data", "nope.tsv", "--task", "sst2", "--model", "some-model"], "nope.tsv: no such file"),
    (["--tol", "0.1", "--steps", "20"], "--tol places its own nodes"),
    (["--dtype", "float8"], "unknown dtype 'float8'"),
    (["--max-nodes", "3"], "--max-nodes must be at least 5"),
])
def test_a_bad_value_is_refused_before_torch_loads(tmp_path, args, message):
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(["score", "--out", "x.h5", *args])],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    report = json.loads(lines[-1])
    assert report["code"] != 0 and report["heavy"] == [], report
    assert len(lines) == 2 and lines[0].startswith("Error: ") and message in lines[0], lines
    assert not (tmp_path / "x.h5").exists()


@pytest.mark.parametrize("call,text", [
    (lambda: aa.score(None, [{"text_a": 5}]), "inputs[0]['text_a'] must be a text"),
    (lambda: aa.score(steps="4"), "steps must be a whole number"),
    (lambda: aa.score(layers="7"), "layers must be a whole number or a list of whole numbers"),
    (lambda: aa.score(examples=[1.5]), "examples must be a selection"),
    (lambda: aa.score(tol=0.1, rule="left"), "tol places its own nodes"),
    (lambda: aa.open_store(None), "path must be a file path"),
    (lambda: aa.open_store(123), "path must be a file path"),
    (lambda: aa.tree("s.h5"), "open the store first"),
    (lambda: aa.tree(None), "example must be a scored example"),
])
def test_misuse_from_python_is_an_attattr_error_naming_the_argument(call, text):
    with pytest.raises(AttattrError) as exc:
        call()
    assert text in str(exc.value) and "--" not in str(exc.value), str(exc.value)


def _one_error(result, needle: str) -> None:
    assert result.exit_code != 0
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_a_nul_character_in_a_text_is_one_line_and_leaves_no_store(tmp_path, tiny_model_dir):
    data = tmp_path / "nul.tsv"
    data.write_text("sentence\tlabel\nfine\t1\nhello\x00world\t0\n")
    out = tmp_path / "n.h5"
    result = CliRunner().invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--task", "sst2",
                                      "--out", str(out)])
    _one_error(result, "line 3, column 'sentence': the text holds a NUL character")
    assert not out.exists()
    with pytest.raises(AttattrError, match="NUL character"):
        aa.score(None, ["a\x00b"])


def test_a_one_megabyte_field_reads_and_truncates(tmp_path, tiny_model_dir):
    data = tmp_path / "big.tsv"
    data.write_text("sentence\tlabel\n" + "w1 " * 350_000 + "\t1\nshort one\t0\n")
    out = tmp_path / "b.h5"
    result = CliRunner().invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--task", "sst2",
                                      "--truncate", "--steps", "2", "--out", str(out), "-q"])
    assert result.exit_code == 0, result.stderr
    with aa.open_store(out) as s:
        assert len(s) == 2 and s[0].truncated
    result = CliRunner().invoke(app, ["score", "--model", str(tiny_model_dir), "--data", str(data), "--task", "sst2",
                                      "--out", str(tmp_path / "c.h5")])
    _one_error(result, "example 0 has 350002 tokens")


def test_examples_beyond_the_data_are_named(tmp_path):
    result = CliRunner().invoke(app, ["score", "--examples", "198:205", "--out", str(tmp_path / "s.h5")])
    assert result.exit_code == 0, result.stderr
    assert "examples 200..204 do not exist (5 asked for beyond the 200 the data has); scoring the 2 that do" \
        in result.stderr


def test_data_without_a_model_does_not_reach_for_a_hub_model(tmp_path):
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\na fine film\t1\n")
    result = CliRunner().invoke(app, ["score", "--data", str(data), "--task", "sst2", "--out", str(tmp_path / "s.h5")])
    _one_error(result, "--data needs --model")
    assert "--model distilbert" in result.stderr and not (tmp_path / "s.h5").exists()


FULL_DISK = """
import errno, json, pathlib, sys
import h5py
def full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")
if sys.argv[2] == "text":
    pathlib.Path.write_text = full
else:
    real = h5py.File.__init__
    def init(self, name, mode="r", *a, **k):
        if mode != "r" and str(name).endswith(".tmp"):
            full()
        real(self, name, mode, *a, **k)
    h5py.File.__init__ = init
sys.argv = ["attattr", *json.loads(sys.argv[1])]
from attattr_cli.cli import app
app()
"""


@pytest.mark.parametrize("command,how", [("report", "text"), ("importance", "h5")])
def test_a_full_disk_is_one_line_and_replaces_nothing(tmp_path, command, how):
    store = tmp_path / "s.h5"
    assert CliRunner().invoke(app, ["score", "--out", str(store), "--examples", "0:2", "-q"]).exit_code == 0
    target = tmp_path / ("rep" if command == "report" else "imp.h5")
    args = ["report", str(store), "-o", f"{target}/"] if command == "report" else \
        ["importance", str(store), "--out", str(target), "-q"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([sys.executable, "-c", FULL_DISK, json.dumps(args), how], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    lines = [line for line in result.stderr.splitlines() if line.strip() and "%" not in line]
    assert result.returncode == 5, result.stderr
    assert len(lines) == 1 and lines[0].startswith("Error: cannot write ") and lines[0].endswith(
        ": the disk is full (No space left on device); nothing was replaced: free some space and run the same"
        " command again"), result.stderr
    assert not target.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["s.h5"]


def test_an_extended_store_equals_one_run_up_to_rounding_and_exactly_with_group_1(tmp_path):
    import numpy as np

    def scored(name, *runs, group=()):
        path = tmp_path / name
        for examples in runs:
            assert CliRunner().invoke(app, ["score", "--out", str(path), "-e", examples, "-q", *group]).exit_code == 0
        with aa.open_store(path) as s:
            return [s[i].attribution for i in s.indices]

    once, twice = scored("a.h5", "0:12"), scored("b.h5", "0:4", "0:12")
    for a, b in zip(once, twice):
        assert np.abs(a - b).max() <= 1e-6 * max(np.abs(a).max(), 1e-12)
    once, twice = scored("c.h5", "0:12", group=["--group", "1"]), scored("d.h5", "0:4", "0:12", group=["--group", "1"])
    assert all(np.array_equal(a, b) for a, b in zip(once, twice))


def _tiny_bert(vocab: int):
    import transformers as tf

    cfg = tf.BertConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=37, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    return cfg, tf.BertForSequenceClassification(cfg)


def test_a_pickled_weights_file_and_a_foreign_tokenizer_are_one_line_each(tmp_path, tokenizer):
    import torch

    data = tmp_path / "one.tsv"
    data.write_text("sentence\tlabel\nw1 w2 w3\t1\n")
    pickled = tmp_path / "pickled"
    cfg, model = _tiny_bert(len(tokenizer))
    cfg.save_pretrained(pickled)
    torch.save(model, pickled / "pytorch_model.bin")  # a whole pickled module, not a state dict
    tokenizer.save_pretrained(pickled)
    result = CliRunner().invoke(app, ["score", "--model", str(pickled), "--data", str(data), "--task", "sst2",
                                      "--out", str(tmp_path / "a.h5")])
    _one_error(result, "its weights file is a pickled Python object")
    small = tmp_path / "small"
    _, model = _tiny_bert(8)  # its embeddings hold 8 tokens; the tokenizer gives ids beyond them
    model.save_pretrained(small)
    tokenizer.save_pretrained(small)
    result = CliRunner().invoke(app, ["score", "--model", str(small), "--data", str(data), "--task", "sst2",
                                      "--out", str(tmp_path / "b.h5")])
    _one_error(result, "the model's embeddings hold 8 tokens: the folder's tokenizer is not the model's")
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


def test_a_model_whose_attention_attattr_cannot_reach_is_one_line(tmp_path, tokenizer, monkeypatch):
    """ConvBERT computes attention outside the interface; without its adapter (every mapped type
    has one or a refusal now, so it is taken away here) it is one line naming it, not torch's
    "inputs argument to grad() cannot be empty"."""
    import transformers as tf

    from attattr_cli.models import adapters

    monkeypatch.delitem(adapters.ADAPTERS, "convbert")
    cfg = tf.ConvBertConfig(vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                            intermediate_size=37, embedding_size=32, num_labels=2,
                            id2label={0: "negative", 1: "positive"}, label2id={"negative": 0, "positive": 1})
    folder = tmp_path / "convbert"
    tf.ConvBertForSequenceClassification(cfg).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    data = tmp_path / "one.tsv"
    data.write_text("sentence\tlabel\nw1 w2 w3\t1\n")
    result = CliRunner().invoke(app, ["score", "--model", str(folder), "--data", str(data), "--task", "sst2",
                                      "--out", str(tmp_path / "r.h5"), "-q"])
    _one_error(result, "model type 'convbert' (ConvBertForSequenceClassification) computes its attention outside"
                       " transformers'")
