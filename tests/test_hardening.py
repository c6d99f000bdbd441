"""Outputs replace a symbolic link instead of writing through it, get the usual mode under
the umask, hostile JSON is one error line, and error text is printed as typed."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from attattr_cli.cli import app
from attattr_cli.data.readers import read_table
from attattr_cli.errors import DataError
from attattr_cli.fileio import replaced, swap_dir_in, temp_dir_for, write_atomic, write_json

runner = CliRunner()

DEEP = "[" * 100000 + "]" * 100000


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def _one_error_line(result, text):
    assert result.exit_code != 0
    lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    assert text in lines[0], lines[0]
    return lines[0]


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """A small real store of the built-in default (2 examples, 2 steps)."""
    p = tmp_path_factory.mktemp("harden") / "s.h5"
    result = _run("score", "--out", p, "--examples", "0:2", "--steps", 2, "-q")
    assert result.exit_code == 0, result.output
    return p


@pytest.fixture
def umask():
    """Set the process umask for one test, restored after."""
    old = os.umask(0o022)
    os.umask(old)

    def set_mask(mask: int) -> None:
        os.umask(mask)

    yield set_mask
    os.umask(old)


# -- symbolic links -------------------------------------------------------------------


def test_a_link_to_another_file_is_replaced_not_written_through(tmp_path):
    other = tmp_path / "precious.txt"
    other.write_text("keep me\n")
    link = tmp_path / "out.json"
    link.symlink_to(other)
    write_json(link, {"a": 1})
    assert other.read_text() == "keep me\n"
    assert not link.is_symlink() and json.loads(link.read_text()) == {"a": 1}


def test_a_dangling_link_is_replaced_by_a_file(tmp_path):
    link = tmp_path / "out.csv"
    link.symlink_to(tmp_path / "elsewhere" / "target.csv")
    write_atomic(link, "a,b\n1,2\n")
    assert not link.is_symlink() and link.read_text() == "a,b\n1,2\n"
    assert not (tmp_path / "elsewhere").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.csv"]  # no temp file left


def test_a_link_to_a_folder_is_replaced_by_the_file(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir()
    link = tmp_path / "out.json"
    link.symlink_to(folder)
    write_atomic(link, "{}\n")
    assert folder.is_dir() and not any(folder.iterdir())
    assert not link.is_symlink() and link.read_text() == "{}\n"


def test_a_real_folder_is_refused(tmp_path):
    from attattr_cli.errors import OptionError

    (tmp_path / "out.json").mkdir()
    with pytest.raises(OptionError, match="is a directory"):
        write_atomic(tmp_path / "out.json", "{}\n")


@pytest.mark.parametrize("dangling", [False, True])
def test_model_folder_replaces_a_link(tmp_path, dangling):
    target = tmp_path / "target"
    if not dangling:
        target.mkdir()
        (target / "weights.bin").write_bytes(b"old")
    link = tmp_path / "model"
    link.symlink_to(target)
    tmp = temp_dir_for(link)
    (tmp / "config.json").write_text("{}")
    swap_dir_in(tmp, link)
    assert not link.is_symlink() and (link / "config.json").read_text() == "{}"
    if dangling:
        assert not target.exists()
    else:
        assert (target / "weights.bin").read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model"] + ([] if dangling else ["target"]))


@pytest.mark.parametrize("dangling", [False, True])
def test_tree_output_link(store, tmp_path, dangling):
    other = tmp_path / "other.json"
    if not dangling:
        other.write_text("not yours\n")
    link = tmp_path / "link.json"
    link.symlink_to(other)
    result = _run("tree", store, "--example", 0, "-o", link, "-q")
    assert result.exit_code == 0, result.output
    assert not link.is_symlink() and json.loads(link.read_text())["example"] == 0
    if dangling:
        assert not other.exists()
    else:
        assert other.read_text() == "not yours\n"


def test_failed_write_leaves_the_output_and_no_temp_file(tmp_path):
    out = tmp_path / "out.png"
    out.write_bytes(b"old picture")
    with pytest.raises(RuntimeError):
        with replaced(out, suffix=".png") as tmp:
            tmp.write_bytes(b"half")
            raise RuntimeError("the plot failed")
    assert out.read_bytes() == b"old picture"
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]


# -- file modes -----------------------------------------------------------------------


MODES = [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700), (0o002, 0o664, 0o775)]


@pytest.mark.parametrize("mask, file_mode, folder_mode", MODES)
def test_files_get_the_usual_mode(tmp_path, umask, mask, file_mode, folder_mode):
    from attattr_cli.analysis import importance as imp
    from attattr_cli.analysis.plots import importance_heatmaps

    umask(mask)
    write_json(tmp_path / "curves.json", {"x": [1, 2]})
    write_atomic(tmp_path / "triggers.csv", "a,b\n")
    table = imp.Table("attr", "attr", np.arange(6, dtype=float).reshape(2, 3))
    imp.write(tmp_path / "imp.h5", imp.Identity("0" * 64, "m", "bert", 2, 3), [table])
    importance_heatmaps([table], tmp_path / "importance.png")
    for name in ("curves.json", "triggers.csv", "imp.h5", "importance.png"):
        assert _mode(tmp_path / name) == file_mode, (name, oct(_mode(tmp_path / name)))
    # the private mode is the temp file's only; replacing keeps giving the usual one
    write_json(tmp_path / "curves.json", {"x": [3]})
    assert _mode(tmp_path / "curves.json") == file_mode
    tmp = temp_dir_for(tmp_path / "model")
    assert _mode(tmp) == 0o700  # private while it is being built
    swap_dir_in(tmp, tmp_path / "model")
    assert _mode(tmp_path / "model") == folder_mode


@pytest.mark.parametrize("mask, file_mode, folder_mode", MODES[:2])
def test_pruned_model_folder_and_tree_modes(tmp_path, umask, loaded_factory, store, mask, file_mode, folder_mode):
    from attattr_cli.analysis import prune as pr

    loaded = loaded_factory("bert")
    umask(mask)
    out = tmp_path / "pruned"
    pr.save_pruned(loaded.model, loaded.tokenizer, [[0, 1], [2], [3]], out)
    assert _mode(out) == folder_mode
    for f in out.iterdir():
        assert _mode(f) == file_mode, (f.name, oct(_mode(f)))
    assert _run("tree", store, "--example", 1, "-o", tmp_path / "t.json", "-q").exit_code == 0
    assert _mode(tmp_path / "t.json") == file_mode


# -- hostile JSON ---------------------------------------------------------------------


def test_deeply_nested_jsonl_line_is_a_data_error(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text('{"sentence": "fine", "label": 0}\n' + DEEP + "\n")
    with pytest.raises(DataError, match=r"deep\.jsonl, line 2: not valid JSON \(arrays or objects nested too deeply\)"):
        read_table(p)
    q = tmp_path / "deep.json"
    q.write_text("[" + DEEP + "]")
    with pytest.raises(DataError, match=r"deep\.json: not valid JSON \(arrays or objects nested too deeply\)"):
        read_table(q)


def test_over_long_number_is_a_data_error(tmp_path):
    p = tmp_path / "long.jsonl"
    p.write_text('{"sentence": "x", "label": ' + "9" * 5000 + "}\n")
    with pytest.raises(DataError, match=r"long\.jsonl, line 1: not valid JSON \(.*\)"):
        read_table(p)


def test_score_on_deeply_nested_data_is_one_error_line(tmp_path):
    p = tmp_path / "deep.jsonl"
    p.write_text(DEEP + "\n")
    result = _run("score", "--data", p, "--out", tmp_path / "s.h5")
    _one_error_line(result, "deep.jsonl, line 1: not valid JSON (arrays or objects nested too deeply)")
    assert not (tmp_path / "s.h5").exists()


def test_import_json_on_deeply_nested_files_is_one_error_line(tmp_path):
    deep = tmp_path / "attr_zero_base_exp0.json"
    deep.write_text(DEEP + "\n")
    tokens = tmp_path / "tokens_and_pred_1.json"
    tokens.write_text(json.dumps([{"index": 0, "tokens": ["[CLS]", "a", "[SEP]"], "pred": 0, "golden": 0}]))
    _one_error_line(_run("import-json", deep, tokens, "--out", tmp_path / "a.h5"),
                    f"{deep}, line 1: not JSON (arrays or objects nested too deeply)")
    one = tmp_path / "attr_zero_base_exp1.json"
    one.write_text(json.dumps([[[1.0, 0.0, 0.0]] * 3]) + "\n")
    _one_error_line(_run("import-json", one, deep, "--out", tmp_path / "b.h5"),
                    f"{deep}, line 1: not JSON (arrays or objects nested too deeply)")
    assert not (tmp_path / "a.h5").exists() and not (tmp_path / "b.h5").exists()


# -- text as typed ----------------------------------------------------------------------


def test_error_text_keeps_colon_codes(tmp_path):
    line = _one_error_line(_run("score", "--examples", "a", "--out", tmp_path / "x.h5"), "0:100:2")
    assert "\N{HUNDRED POINTS SYMBOL}" not in line


def test_names_from_the_file_cannot_split_the_error_line(tmp_path):
    from attattr_cli.data import get_task, load_examples

    p = tmp_path / "odd.jsonl"
    p.write_text('{"label": "0", "\\n": "0"}\n')
    with pytest.raises(DataError) as info:
        load_examples(str(p), None, None)
    assert "\n" not in str(info.value) and "columns found: label, \\n" in str(info.value)
    q = tmp_path / "odd.csv"
    q.write_text('sentence,label\nfine,"x\ny"\n')
    with pytest.raises(DataError) as info:
        load_examples(str(q), get_task("sst2"), ("negative", "positive"))
    assert "\n" not in str(info.value) and "unknown label 'x\\ny'" in str(info.value)


@pytest.mark.parametrize("name, text", [("empty.csv", ",\n"), ("quoted.csv", "\"\",\" \"\n,\n")])
def test_a_file_of_empty_rows_is_a_data_error(tmp_path, name, text):
    (tmp_path / name).write_text(text)
    with pytest.raises(DataError, match=f"{name}: the file holds only empty rows, no header"):
        read_table(tmp_path / name)


def test_undecodable_bytes_in_a_name_or_a_stored_string_print_as_escapes(store, tmp_path):
    """A file name with bytes that are not UTF-8 (held by Python as lone surrogates) and a
    store attribute holding such bytes print as \\xNN; a print that raised would have left
    rich's buffer full and spoilt every later command's output in the same process."""
    import shutil

    import h5py

    odd = Path(os.fsdecode(bytes(tmp_path) + b"/s\xff.h5"))
    shutil.copyfile(store, odd)
    with h5py.File(odd, "r+") as f:
        f.attrs["note"] = np.bytes_(b"caf\xe9")  # latin-1, not UTF-8
    first = _run("info", odd)
    assert first.exit_code == 0, first.output
    assert "s\\xff.h5" in first.output
    missing = _run("info", Path(os.fsdecode(bytes(tmp_path) + b"/gone\xfe.h5")))
    line = _one_error_line(missing, "gone\\xfe.h5")
    assert "\\xff" not in line  # nothing left over from the command before
    after = _run("info", store)
    assert after.exit_code == 0 and "s\\xff" not in after.output, after.output


# -- outputs the API would have put in the wrong place, and models scored as what they are not --------
@pytest.fixture(scope="module")
def scored():
    import attattr_cli as aa

    return aa.score(None, examples="0:1", steps=2)


def test_an_output_in_a_missing_folder_is_refused_and_no_folder_made(scored, tmp_path):
    from attattr_cli.errors import OptionError

    e = scored[0]
    for call in (lambda p: e.plot(path=p), lambda p: e.save(p), lambda p: scored.save(p.with_suffix(".h5"))):
        with pytest.raises(OptionError, match="the folder .*nodir does not exist"):
            call(tmp_path / "nodir" / "x.png")
    assert list(tmp_path.iterdir()) == []


def test_a_store_is_never_written_into_a_device(scored, tmp_path):
    """A name that leads to a character device (/dev/null through a link): refused, the link
    and the device left as they are."""
    from attattr_cli.errors import OptionError

    link = tmp_path / "dev.h5"
    link.symlink_to(os.devnull)
    for call in (lambda: scored.save(link), lambda: scored[0].save(link)):
        with pytest.raises(OptionError, match="a device, a FIFO or a socket"):
            call()
    assert link.is_symlink() and os.readlink(link) == os.devnull and stat.S_ISCHR(os.stat(os.devnull).st_mode)


@pytest.fixture(scope="module")
def lm_folder(tmp_path_factory, tokenizer):
    import torch

    from conftest import build_model

    folder = tmp_path_factory.mktemp("lm") / "tiny-llama"
    build_model("llama", torch.float32, layers=2, lm=True).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_a_language_model_scored_as_a_classifier_is_refused(lm_folder, tmp_path):
    out = tmp_path / "s.h5"
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\nw1 w2\t1\n")
    line = _one_error_line(_run("score", "--model", lm_folder, "--task", "sst2", "--data", data, "--out", out),
                           "is a language model (LlamaForCausalLM), not a sequence classifier")
    assert "pass --lm" in line and _run("score", "--model", lm_folder, "--data", data, "--out", out).exit_code == 2
    assert not out.exists()
    r = _run("score", "--lm", "--model", lm_folder, "--prompt", "w1 w2", "--steps", 2, "--out", out, "-q")
    assert r.exit_code == 0, r.output


def test_faithfulness_of_a_language_model_store_says_what_it_holds(lm_folder, tmp_path):
    store = tmp_path / "g.h5"
    r = _run("score", "--lm", "--model", lm_folder, "--prompt", "w1 w2 w3", "--generate", 2, "--steps", 2,
             "--out", store, "-q")
    assert r.exit_code == 0, r.output
    before = store.read_bytes()
    line = _one_error_line(_run("faithfulness", store, "--out", tmp_path / "f.json", "-q"),
                           "holds a language model's generation, step by step (scored with --lm)")
    assert "another model" not in line
    assert store.read_bytes() == before and not (tmp_path / "f.json").exists()
