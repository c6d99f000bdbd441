"""Tests of attattr_cli.data: readers, task presets, example loading and selection."""

from __future__ import annotations

import json
import os
import sys
import types
from pathlib import Path

import pytest

from attattr_cli.data import (
    GENERIC,
    TASKS,
    Example,
    get_task,
    load_examples,
    parse_examples,
    read_rows,
    resolve_model_for_task,
)
from attattr_cli.errors import DataError, OptionError
from conftest import shared_data


def write(path: Path, text: str) -> str:
    path.write_text(text, encoding="utf-8")
    return str(path)


def raises(exc_type, func, *args, **kwargs) -> str:
    with pytest.raises(exc_type) as info:
        func(*args, **kwargs)
    return str(info.value)


# ----------------------------------------------------------------------------- readers


def test_tsv_keeps_stray_quotes(tmp_path):
    path = write(
        tmp_path / "d.tsv",
        'sentence\tlabel\n'
        'he said "hi\t1\n'
        '"quoted whole"\t0\n'
        "it 's a \"\"fine\"\" film\t1\n",
    )
    cols, rows = read_rows(path)
    assert cols == ["sentence", "label"]
    assert [r["sentence"] for r in rows] == ['he said "hi', '"quoted whole"', 'it \'s a ""fine"" film']
    assert [r["label"] for r in rows] == ["1", "0", "1"]


def test_tsv_bom_crlf_and_blank_lines(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_bytes("\ufeffQuality\t#1 String\r\n1\ta\r\n\r\n0\tb\r\n\n".encode("utf-8"))
    cols, rows = read_rows(path)
    assert cols == ["Quality", "#1 String"]
    assert rows == [{"Quality": "1", "#1 String": "a"}, {"Quality": "0", "#1 String": "b"}]


def test_csv_quoted_commas_and_newlines(tmp_path):
    path = write(
        tmp_path / "d.csv",
        'text,label\n"one, two, three",positive\n"say ""hi""",negative\n"two\nlines",0\n',
    )
    cols, rows = read_rows(path)
    assert cols == ["text", "label"]
    assert [r["text"] for r in rows] == ["one, two, three", 'say "hi"', "two\nlines"]


def test_jsonl(tmp_path):
    path = write(
        tmp_path / "d.jsonl",
        '{"premise": "a", "hypothesis": "b", "label": 0}\n\n{"premise": "c", "hypothesis": "d", "label": "neutral", "id": 7}\n',
    )
    cols, rows = read_rows(path)
    assert cols == ["premise", "hypothesis", "label", "id"]
    assert rows[0]["label"] == 0 and rows[1]["id"] == 7


def test_json_extension_lines_and_array(tmp_path):
    lines = write(tmp_path / "a.json", '{"text": "x"}\n{"text": "y"}\n')
    array = write(tmp_path / "b.JSON", '[{"text": "x"}, {"text": "y"}]')
    assert read_rows(lines) == (["text"], [{"text": "x"}, {"text": "y"}])
    assert read_rows(array) == (["text"], [{"text": "x"}, {"text": "y"}])


# ----------------------------------------------------------------------------- reader errors


def test_error_missing_file(tmp_path):
    path = str(tmp_path / "nope.tsv")
    assert raises(DataError, read_rows, path) == f"{path}: no such file"


def test_error_directory(tmp_path):
    path = tmp_path / "dir.tsv"
    path.mkdir()
    assert raises(DataError, read_rows, str(path)) == f"{path}: is a directory, not a data file"


def test_error_unsupported_extension(tmp_path):
    path = write(tmp_path / "d.txt", "x\n")
    assert raises(DataError, read_rows, path) == (
        f"{path}: unsupported file type ('.txt'); use a .tsv, .csv, .jsonl or .json (JSON lines) file"
    )
    bare = write(tmp_path / "data", "x\n")
    assert raises(DataError, read_rows, bare) == (
        f"{bare}: unsupported file type (no extension); use a .tsv, .csv, .jsonl or .json (JSON lines) file"
    )


@pytest.mark.parametrize("name", ["e.tsv", "e.csv", "e.jsonl"])
def test_error_empty_file(tmp_path, name):
    path = write(tmp_path / name, "\n  \n")
    assert raises(DataError, read_rows, path) == f"{path}: the file is empty"


def test_error_header_only(tmp_path):
    path = write(tmp_path / "h.tsv", "sentence\tlabel\n")
    assert raises(DataError, read_rows, path) == f"{path}: the file has a header but no data rows"


def test_error_invalid_utf8(tmp_path):
    path = tmp_path / "bad.tsv"
    path.write_bytes(b"sentence\tlabel\nfine\t1\ncaf\xe9\t0\n")
    assert raises(DataError, read_rows, str(path)) == f"{path}, line 3: not valid UTF-8 text (byte 0xe9)"


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root reads any file")
def test_error_unreadable(tmp_path):
    path = tmp_path / "locked.tsv"
    path.write_text("sentence\nx\n")
    path.chmod(0)
    try:
        assert raises(DataError, read_rows, str(path)) == f"{path}: cannot read the file (Permission denied)"
    finally:
        path.chmod(0o644)


def test_error_jsonl_not_object(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "a"}\n\n["text", "b"]\n')
    assert raises(DataError, read_rows, path) == f"{path}, line 3: expected a JSON object, got an array"


def test_error_jsonl_invalid_json(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"text": "a"}\n{"text": \n')
    assert raises(DataError, read_rows, path) == f"{path}, line 2: not valid JSON (Expecting value)"


def test_error_ragged_tsv(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence1\tsentence2\tlabel\na\tb\t0\n\nc\td\n")
    assert raises(DataError, read_rows, path) == f"{path}, line 4: 2 fields, but the header has 3"


def test_error_ragged_csv_after_multiline_field(tmp_path):
    path = write(tmp_path / "d.csv", 'text,label\n"a\nb",1\nc,1,extra\n')
    assert raises(DataError, read_rows, path) == f"{path}, line 4: 3 fields, but the header has 2"


def test_error_duplicate_header(tmp_path):
    path = write(tmp_path / "d.csv", "text,text\na,b\n")
    assert raises(DataError, read_rows, path) == f"{path}, line 1: the header names column 'text' twice"


# ----------------------------------------------------------------------------- registry


def test_registry_contents():
    assert set(TASKS) == {"sst2", "mnli", "rte", "mrpc", "snli", "qnli", "synthetic"}
    assert TASKS["mnli"].hub.path == "nyu-mll/glue"
    assert (TASKS["mnli"].hub.config, TASKS["mnli"].hub.split) == ("mnli", "validation_matched")
    assert (TASKS["snli"].hub.path, TASKS["snli"].hub.config, TASKS["snli"].hub.split) == (
        "stanfordnlp/snli",
        None,
        "validation",
    )
    for name in ("sst2", "rte", "mrpc", "qnli"):
        assert (TASKS[name].hub.path, TASKS[name].hub.config, TASKS[name].hub.split) == (
            "nyu-mll/glue",
            name,
            "validation",
        )
    assert TASKS["synthetic"].builtin and TASKS["synthetic"].hub is None
    assert TASKS["sst2"].labels == ("negative", "positive")
    assert TASKS["mrpc"].labels == ("not_equivalent", "equivalent")
    assert TASKS["qnli"].labels == TASKS["rte"].labels == ("entailment", "not_entailment")


def test_get_task():
    assert get_task("MNLI") is TASKS["mnli"]
    assert raises(OptionError, get_task, "cola") == (
        "unknown task 'cola'; available tasks: sst2, mnli, rte, mrpc, snli, qnli, synthetic"
    )


def test_resolve_model_for_task():
    assert resolve_model_for_task(TASKS["mnli"], None) == "FacebookAI/roberta-large-mnli"
    assert (
        resolve_model_for_task(TASKS["sst2"], None)
        == "distilbert/distilbert-base-uncased-finetuned-sst-2-english"
    )
    assert resolve_model_for_task(TASKS["mnli"], "my/model") == "my/model"
    assert resolve_model_for_task(TASKS["rte"], None) is None
    assert resolve_model_for_task(None, None) is None


# ----------------------------------------------------------------------------- presets


def test_preset_sst2(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\na \"good\" film .\t1\nbad .\tnegative\n")
    examples, names = load_examples(path, get_task("sst2"))
    assert names == ("negative", "positive")
    assert examples == [
        Example(0, 'a "good" film .', None, 1, {}),
        Example(1, "bad .", None, 0, {}),
    ]


def test_preset_mnli_glue_layout(tmp_path):
    header = "index\tgenre\tsentence1\tsentence2\tlabel1\tgold_label\n"
    path = write(
        tmp_path / "dev_matched.tsv",
        header + "0\tfiction\tP0\tH0\tneutral\tNeutral\n1\tslate\tP1\tH1\tcontradiction\tcontradiction\n",
    )
    examples, names = load_examples(path, get_task("mnli"))
    assert names == ("entailment", "neutral", "contradiction")
    assert [(e.text_a, e.text_b, e.label) for e in examples] == [("P0", "H0", 1), ("P1", "H1", 2)]
    assert examples[0].meta == {"index": "0", "genre": "fiction", "label1": "neutral"}


def test_preset_rte_string_labels(tmp_path):
    path = write(
        tmp_path / "d.tsv",
        "index\tsentence1\tsentence2\tlabel\n0\ta\tb\tnot_entailment\n1\tc\td\tentailment\n2\te\tf\tNot-Entailment\n",
    )
    examples, names = load_examples(path, get_task("rte"))
    assert names == ("entailment", "not_entailment")
    assert [e.label for e in examples] == [1, 0, 1]
    assert [e.meta for e in examples] == [{"index": "0"}, {"index": "1"}, {"index": "2"}]


def test_preset_mrpc_original_layout(tmp_path):
    path = tmp_path / "msr.tsv"
    path.write_bytes(
        '\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t11\t12\tHe said "yes\tHe agreed .\n'.encode()
    )
    examples, names = load_examples(str(path), get_task("mrpc"))
    assert names == ("not_equivalent", "equivalent")
    assert examples == [Example(0, 'He said "yes', "He agreed .", 1, {"#1 ID": "11", "#2 ID": "12"})]


def test_preset_snli_jsonl_no_consensus(tmp_path):
    rows = [
        {"gold_label": "entailment", "sentence1": "a", "sentence2": "b", "pairID": "p0",
         "annotator_labels": ["entailment", "neutral"]},
        {"gold_label": "-", "sentence1": "c", "sentence2": "d", "pairID": "p1"},
        {"gold_label": -1, "sentence1": "e", "sentence2": "f", "pairID": "p2"},
    ]
    path = write(tmp_path / "snli.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    examples, names = load_examples(path, get_task("snli"))
    assert names == ("entailment", "neutral", "contradiction")
    assert [e.label for e in examples] == [0, None, None]
    assert examples[0].meta == {"pairID": "p0", "annotator_labels": '["entailment", "neutral"]'}
    json.dumps([e.meta for e in examples])  # serialisable


def test_preset_qnli_csv(tmp_path):
    path = write(tmp_path / "d.csv", 'question,sentence,label\n"Who, then?",Someone .,0\nWhy?,Because .,\n')
    examples, _ = load_examples(path, get_task("qnli"))
    assert [(e.text_a, e.text_b, e.label) for e in examples] == [
        ("Who, then?", "Someone .", 0),
        ("Why?", "Because .", None),
    ]


def test_preset_synthetic_file(tmp_path):
    path = write(
        tmp_path / "syn.tsv",
        'premise\thypothesis\tlabel\tpair\nlomi blick\tkiki\tentailment\t["blick", "kiki"]\n',
    )
    examples, names = load_examples(path, get_task("synthetic"))
    assert names == ("entailment", "neutral", "contradiction")
    assert examples == [Example(0, "lomi blick", "kiki", 0, {"pair": '["blick", "kiki"]'})]


def test_unlabelled_file_loads_with_no_labels(tmp_path):
    path = write(tmp_path / "test.tsv", "index\tsentence1\tsentence2\n0\ta\tb\n")
    examples, names = load_examples(path, get_task("rte"))
    assert names == ("entailment", "not_entailment")
    assert examples == [Example(0, "a", "b", None, {"index": "0"})]


def test_missing_label_markers(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\na\t\nb\t-1\nc\t-\nd\t 1 \n")
    examples, _ = load_examples(path, get_task("sst2"))
    assert [e.label for e in examples] == [None, None, None, 1]


# ----------------------------------------------------------------------------- load errors


def test_error_unknown_label(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence1\tsentence2\tlabel\na\tb\tentailment\nc\td\tmaybe\n")
    assert raises(DataError, load_examples, path, get_task("rte")) == (
        f"{path}, line 3: unknown label 'maybe'; valid labels: entailment, not_entailment (or 0..1)"
    )


def test_error_label_out_of_range(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"sentence": "a", "label": 1}\n{"sentence": "b", "label": 2}\n')
    assert raises(DataError, load_examples, path, get_task("sst2")) == (
        f"{path}, line 2: unknown label '2'; valid labels: negative, positive (or 0..1)"
    )


def test_error_missing_column(tmp_path):
    path = write(tmp_path / "d.tsv", "premise\tlabel\na\t0\n")
    assert raises(DataError, load_examples, path, get_task("mnli")) == (
        f"{path}: task 'mnli' expects columns premise (or sentence1), hypothesis (or sentence2) "
        f"and optionally label (or gold_label); columns found: premise, label"
    )
    path2 = write(tmp_path / "e.tsv", "text\tlabel\na\t0\n")
    assert raises(DataError, load_examples, path2, get_task("sst2")) == (
        f"{path2}: task 'sst2' expects columns sentence and optionally label; columns found: text, label"
    )


def test_error_jsonl_row_lacks_text(tmp_path):
    path = write(tmp_path / "d.jsonl", '{"sentence": "a"}\n{"label": 1}\n')
    assert raises(DataError, load_examples, path, get_task("sst2")) == (
        f"{path}, line 2: no value in column 'sentence'"
    )


# ----------------------------------------------------------------------------- generic


def test_generic_guesses_pair_columns_and_int_labels(tmp_path):
    path = write(tmp_path / "d.tsv", "question\tsentence\tlabel\tid\nq?\ts .\t2\tx\nq2?\ts2 .\t0\ty\n")
    examples, names = load_examples(path, None)
    assert names == ("LABEL_0", "LABEL_1", "LABEL_2")
    assert examples[0] == Example(0, "q?", "s .", 2, {"id": "x"})


def test_generic_single_text_no_label(tmp_path):
    path = write(tmp_path / "d.csv", "text,source\nhello,web\n")
    examples, names = load_examples(path, None)
    assert names == ()
    assert examples == [Example(0, "hello", None, None, {"source": "web"})]


def test_generic_string_labels_need_names(tmp_path):
    path = write(tmp_path / "d.csv", "text,label\nhello,POSITIVE\nbye,negative\n")
    assert raises(DataError, load_examples, path, None) == (
        f"{path}, line 2: label 'POSITIVE' is a name, but no label names are known; "
        f"pass --task NAME or use a model whose config names its labels"
    )
    examples, names = load_examples(path, None, label_names=["NEGATIVE", "POSITIVE"])
    assert names == ("NEGATIVE", "POSITIVE")
    assert [e.label for e in examples] == [1, 0]


def test_generic_int_labels_with_model_names(tmp_path):
    path = write(tmp_path / "d.csv", "text,label\nhello,1\nbye,5\n")
    assert raises(DataError, load_examples, path, None, ["NEGATIVE", "POSITIVE"]) == (
        f"{path}, line 3: unknown label '5'; valid labels: NEGATIVE, POSITIVE (or 0..1)"
    )


def test_generic_cannot_guess(tmp_path):
    path = write(tmp_path / "d.csv", "body,label\nhello,1\n")
    assert raises(DataError, load_examples, path, None) == (
        f"{path}: cannot tell which columns hold the text; expected sentence or text, or a pair "
        f"premise/hypothesis, sentence1/sentence2, question/sentence, text_a/text_b "
        f"(or pass --task NAME); columns found: body, label"
    )


def test_generic_needs_a_source():
    assert raises(OptionError, load_examples, None, None) == (
        "no data to load: pass --data PATH, or --task NAME for a preset "
        "(sst2, mnli, rte, mrpc, snli, qnli, synthetic)"
    )
    assert GENERIC.name == "generic"


# ----------------------------------------------------------------------------- model label names


def test_model_label_order_is_followed(tmp_path):
    # roberta-large-mnli: 0 CONTRADICTION, 1 NEUTRAL, 2 ENTAILMENT; GLUE: 0 entailment ... 2 contradiction
    path = write(tmp_path / "d.tsv", "premise\thypothesis\tlabel\na\tb\t0\nc\td\tcontradiction\ne\tf\t1\n")
    examples, names = load_examples(path, get_task("mnli"), ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"])
    assert names == ("CONTRADICTION", "NEUTRAL", "ENTAILMENT")
    assert [e.label for e in examples] == [2, 0, 1]


def test_model_unnamed_labels_follow_task_order(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence\tlabel\na\t1\n")
    examples, names = load_examples(path, get_task("sst2"), ["LABEL_0", "LABEL_1"])
    assert names == ("negative", "positive") and examples[0].label == 1
    assert raises(OptionError, load_examples, path, get_task("sst2"), ["LABEL_0", "LABEL_1", "LABEL_2"]) == (
        "the model has 3 labels but task 'sst2' has 2 (negative, positive)"
    )


def test_model_labels_that_do_not_fit(tmp_path):
    path = write(tmp_path / "d.tsv", "sentence1\tsentence2\tlabel\na\tb\t1\n")
    assert raises(OptionError, load_examples, path, get_task("rte"), ["contradiction", "neutral", "entailment"]) == (
        "the model's labels (contradiction, neutral, entailment) do not include 'not_entailment' "
        "of task 'rte' (entailment, not_entailment)"
    )


# ----------------------------------------------------------------------------- built-in and hub data


def test_synthetic_builtin_uses_heldout(monkeypatch):
    fake = types.ModuleType("attattr_cli.data.synthetic")
    fake.LABELS = ("contradiction", "entailment", "neutral")  # deliberately another order
    fake.heldout = lambda count=200: [
        Example(5, "p", "h", 0, {"pair": ["a", "b"]}),
        Example(6, "p2", "h2", None, {}),
    ]
    monkeypatch.setitem(sys.modules, "attattr_cli.data.synthetic", fake)
    import attattr_cli.data as data_pkg

    monkeypatch.setattr(data_pkg, "synthetic", fake, raising=False)
    examples, names = load_examples(None, get_task("synthetic"))
    assert names == ("entailment", "neutral", "contradiction")
    assert examples == [Example(5, "p", "h", 2, {"pair": ["a", "b"]}), Example(6, "p2", "h2", None, {})]


def test_synthetic_builtin_real_module():
    synthetic = pytest.importorskip("attattr_cli.data.synthetic")
    examples, names = load_examples(None, get_task("synthetic"))
    assert names == ("entailment", "neutral", "contradiction")
    expected = synthetic.heldout()
    assert len(examples) == len(expected)
    assert [(e.index, e.text_a, e.text_b) for e in examples] == [(e.index, e.text_a, e.text_b) for e in expected]
    assert [names[e.label] for e in examples] == [synthetic.LABELS[e.label] for e in expected]


def test_hub_without_datasets(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)  # makes `import datasets` raise ImportError
    assert raises(DataError, load_examples, None, get_task("mnli")) == (
        "no local data for task 'mnli': its hub dev split needs the 'datasets' package, which is not installed"
        " (pip install 'attattr[hub]'); or pass --data PATH to a TSV, CSV or JSONL file with columns premise,"
        " hypothesis, label"
    )
    assert raises(DataError, load_examples, None, get_task("sst2")).endswith(
        "or pass --data PATH to a TSV, CSV or JSONL file with columns sentence, label"
    )


class _FakeDataset(list):
    column_names = ["premise", "hypothesis", "label", "idx"]


def test_hub_unreachable(monkeypatch):
    fake = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        raise ConnectionError("offline")

    fake.load_dataset = load_dataset
    monkeypatch.setitem(sys.modules, "datasets", fake)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr("attattr_cli.hub.hub_reachable", lambda timeout=3.0: False)
    message = raises(DataError, load_examples, None, get_task("snli"))
    assert message.startswith("no local data for task 'snli': the hub is unreachable from this machine; pass --data")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    message = raises(DataError, load_examples, None, get_task("snli"))
    assert message.startswith("no local data for task 'snli': the hub is switched off here (HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.setattr("attattr_cli.hub.hub_reachable", lambda timeout=3.0: True)
    message = raises(DataError, load_examples, None, get_task("snli"))
    assert message.startswith("no local data for task 'snli': the hub could not provide stanfordnlp/snli (offline)")


def test_hub_rows_are_converted(monkeypatch):
    calls = []
    fake = types.ModuleType("datasets")

    def load_dataset(*args, **kwargs):
        calls.append((args, kwargs))
        return _FakeDataset(
            [
                {"premise": "a", "hypothesis": "b", "label": 2, "idx": 0},
                {"premise": "c", "hypothesis": "d", "label": -1, "idx": 1},
            ]
        )

    fake.load_dataset = load_dataset
    fake.disable_progress_bars = lambda: None
    monkeypatch.setitem(sys.modules, "datasets", fake)
    examples, names = load_examples(None, get_task("mnli"))
    assert calls == [(("nyu-mll/glue", "mnli"), {"split": "validation_matched"})]
    assert names == ("entailment", "neutral", "contradiction")
    assert examples == [Example(0, "a", "b", 2, {"idx": "0"}), Example(1, "c", "d", None, {"idx": "1"})]
    load_examples(None, get_task("snli"))
    assert calls[-1] == (("stanfordnlp/snli",), {"split": "validation"})


# ----------------------------------------------------------------------------- real GLUE files


def test_real_sst2_dev():
    examples, names = load_examples(str(shared_data("sst2", "dev.tsv")), get_task("sst2"))
    assert len(examples) == 872
    assert names == ("negative", "positive")
    assert {e.label for e in examples} == {0, 1}
    assert [e.index for e in examples] == list(range(872))
    assert all(e.text_b is None and e.meta == {} for e in examples)
    assert examples[0].text_a == "one long string of cliches ."


def test_real_rte_dev():
    # This copy is the `datasets` export: integer labels (0 entailment, 1 not_entailment)
    # and an `idx` column, which goes into meta.
    examples, names = load_examples(str(shared_data("rte", "dev.tsv")), get_task("rte"))
    assert len(examples) == 277
    assert names == ("entailment", "not_entailment")
    assert {e.label for e in examples} == {0, 1}
    assert examples[0].text_b == "Christopher Reeve had an accident."
    assert examples[0].label == 1
    assert [e.meta["idx"] for e in examples] == [str(i) for i in range(277)]
    assert any('"' in e.text_a for e in examples)  # stray quotes survive QUOTE_NONE


# ----------------------------------------------------------------------------- parse_examples


@pytest.mark.parametrize(
    ("spec", "total", "expected"),
    [
        (None, 4, [0, 1, 2, 3]),
        (None, 0, []),
        ("0:3", 10, [0, 1, 2]),
        (":2", 10, [0, 1]),
        ("8:", 10, [8, 9]),
        ("0:10:4", 10, [0, 4, 8]),
        ("0:100", 5, [0, 1, 2, 3, 4]),
        ("3,7,9", 10, [3, 7, 9]),
        ("0:2,5, 8:10", 10, [0, 1, 5, 8, 9]),
        ("-1", 10, [9]),
        ("-2:", 10, [8, 9]),
        ("::-3", 10, [9, 6, 3, 0]),
        ("3,1:4,3,-7", 10, [3, 1, 2]),
        ("9", 10, [9]),
    ],
)
def test_parse_examples(spec, total, expected):
    assert parse_examples(spec, total) == expected


@pytest.mark.parametrize(
    ("spec", "total", "message"),
    [
        ("900", 872, "example 900 is out of range: the data has 872 examples (0..871)"),
        ("1,-873", 872, "example -873 is out of range: the data has 872 examples (0..871)"),
        ("1", 1, "example 1 is out of range: the data has 1 example (0..0)"),
        ("0", 0, "example 0 is out of range: the data has no examples"),
        (
            "1,x",
            10,
            "bad example selection '1,x': 'x' is neither an index (such as 7) nor a slice "
            "(such as 0:100 or 0:100:2)",
        ),
        ("1,,2", 10, "bad example selection '1,,2': an empty item between commas"),
        ("3,", 10, "bad example selection '3,': an empty item between commas"),
        (
            "1:2:3:4",
            10,
            "bad example selection '1:2:3:4': '1:2:3:4' is neither an index (such as 7) nor a slice "
            "(such as 0:100 or 0:100:2)",
        ),
        ("0:5:0", 10, "bad example selection '0:5:0': slice '0:5:0' has step 0"),
        ("5:2", 10, "example selection '5:2' selects no examples (the data has 10)"),
        ("  ", 10, "empty example selection: give indices or slices such as 0:100 or 3,7,9"),
    ],
)
def test_parse_examples_errors(spec, total, message):
    assert raises(OptionError, parse_examples, spec, total) == message
