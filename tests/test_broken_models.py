"""A model folder that cannot be used is one ModelError line (exit status 3) in every command
that loads a model, through the one loader (attattr_cli/models/loading.py): weights of random
bytes or cut short, a config.json whose sizes do not match the weights, and a tokenizer whose
ids the model's embedding lacks."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from conftest import WORDS, one_error_line, run_cli


def _random(d):
    (d / "model.safetensors").write_bytes(os.urandom(4096))


def _truncated(d):
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])


def _sizes(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["intermediate_size"] = 64
    (d / "config.json").write_text(json.dumps(cfg))


def _more_layers(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] += 2
    (d / "config.json").write_text(json.dumps(cfg))


def _vocabulary(d):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS, *[f"x{i}" for i in range(20)]]
    for f in d.glob("tokenizer*"):
        f.unlink()
    (d / "vocab.txt").write_text("\n".join(words) + "\n")


BROKEN = {"random bytes": (_random, "its weights file cannot be read"),
          "cut short": (_truncated, "its weights file cannot be read"),
          "other sizes": (_sizes, "its config.json does not match its weights"),
          "more layers": (_more_layers, "its weights lack"),
          "vocabulary": (_vocabulary, "the model's embeddings hold 45 tokens")}


@pytest.fixture(scope="module")
def files(tmp_path_factory, tiny_model_dir):
    d = tmp_path_factory.mktemp("broken")
    data = d / "d.tsv"
    data.write_text("sentence\tlabel\n" + "".join(f"{' '.join(WORDS[i:i + 6])}\t{i % 2}\n" for i in range(6)))
    imp, trig = d / "imp.h5", d / "t.json"
    r = run_cli("importance", "--model", tiny_model_dir, "--data", data, "--task", "sst2", "--methods", "random",
                "--out", imp, "-q")
    assert r.exit_code == 0, r.output
    r = run_cli("triggers", "--model", tiny_model_dir, "--data", data, "--task", "sst2", "--steps", 2, "--top", 1,
                "--out", trig, "-q")
    assert r.exit_code == 0, r.output
    return {"data": data, "importance": imp, "triggers": trig}


COMMANDS = {
    "importance": lambda m, f, t: ["importance", "--model", m, "--data", f["data"], "--task", "sst2",
                                   "--methods", "taylor", "--out", t / "i.h5", "-q"],
    "prune": lambda m, f, t: ["prune", "--model", m, "--data", f["data"], "--task", "sst2",
                              "--importance", f["importance"], "--out", t / "p.json", "-q"],
    "attack": lambda m, f, t: ["attack", "--model", m, "--data", f["data"], "--task", "sst2",
                               "--triggers", f["triggers"], "--out", t / "a.json", "-q"],
    "score": lambda m, f, t: ["score", "--model", m, "--data", f["data"], "--task", "sst2", "--steps", 2,
                              "--out", t / "s.h5", "-q"],
}


@pytest.mark.parametrize("broken", list(BROKEN))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_broken_model_is_one_line(files, tiny_model_dir, tmp_path, broken, command):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    spoil, said = BROKEN[broken]
    spoil(model)
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(*COMMANDS[command](model, files, out))
    assert result.exit_code == 3, result.output
    one_error_line(result, said)
    assert not any(out.iterdir())


def test_finetune_refuses_a_broken_model_in_one_line(files, tiny_model_dir, tmp_path):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    _random(model)
    result = run_cli("finetune", "--model", model, "--data", files["data"], "--task", "sst2", "--out", tmp_path / "ft")
    one_error_line(result, "its weights file cannot be read")
    assert not (tmp_path / "ft").exists()
