"""A bounded fuzz run over what reads files a user hands to attattr: the data readers
(TSV, CSV, JSON lines), the store opener (mutated stores) and the 2021 JSON importer.

The contract checked on every generated input: the command ends with a result or with
exactly one ``Error:`` line on stderr, never with a traceback, and never changes its input
file (sha256 before and after). The CLI is driven in-process with typer's CliRunner.

The budget is small so that the whole module stays within about a minute of CI; set
ATTATTR_FUZZ_EXAMPLES (inputs per test, e.g. 2000) for a longer run (``just fuzz``), which
then draws fresh random inputs instead of the fixed sequence CI uses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from attattr_cli.cli import app
from attattr_cli.data import get_task, load_examples
from attattr_cli.errors import AttattrError

runner = CliRunner()

_ON_DEMAND = os.environ.get("ATTATTR_FUZZ_EXAMPLES")


def budget(ci: int):
    """Hypothesis settings: ``ci`` inputs in CI (a fixed sequence), ATTATTR_FUZZ_EXAMPLES on demand."""
    return settings(
        max_examples=int(_ON_DEMAND) if _ON_DEMAND else ci,
        derandomize=not _ON_DEMAND,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                               HealthCheck.function_scoped_fixture],
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _run(*args):
    return runner.invoke(app, [str(a) for a in args])


def check_contract(result, inputs: dict[Path, str]) -> None:
    """A result or one ``Error:`` line, no traceback, inputs unchanged."""
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception  # a traceback: re-raised so that hypothesis reports it
    if result.exit_code != 0:
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr[-2000:]
    for path, digest in inputs.items():
        assert _sha(path) == digest, f"{path} was changed"


# -- mutations shared by the text formats --------------------------------------------------

DEEP = "[" * 5000 + "]" * 5000  # nested far past the JSON parser's recursion limit


@st.composite
def mutated(draw, text: str) -> bytes:
    """``text`` as UTF-8, then a few byte-level changes: cut, insert, delete, duplicate,
    flip bytes, add a BOM, an invalid UTF-8 byte, NULs, CRs or a deeply nested line."""
    data = bytearray(text.encode("utf-8"))
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["cut", "insert", "delete", "dup", "flip", "bom", "bad", "nul", "cr", "deep", "long"]))
        at = draw(st.integers(0, len(data)))
        if kind == "cut":
            data = data[:at]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "delete":
            del data[at:at + draw(st.integers(1, 8))]
        elif kind == "dup":
            data[at:at] = data[max(0, at - 20):at]
        elif kind == "flip" and data:
            i = min(at, len(data) - 1)
            data[i] ^= 1 << draw(st.integers(0, 7))
        elif kind == "bom":
            data[0:0] = b"\xef\xbb\xbf"
        elif kind == "bad":
            data[at:at] = b"\xff"
        elif kind == "nul":
            data[at:at] = b"\x00"
        elif kind == "cr":
            data[at:at] = b"\r"
        elif kind == "deep":
            data[at:at] = ("\n" + DEEP + "\n").encode()
        elif kind == "long":
            data[at:at] = ("9" * 5000).encode()
    return bytes(data)


# -- data readers ----------------------------------------------------------------------------

COLUMNS = ["sentence", "text", "label", "premise", "hypothesis", "sentence1", "sentence2", "question",
           "idx", "gold_label", "x"]
LABELS = ["0", "1", "2", "-1", "positive", "negative", "entailment", "not_entailment", "neutral",
          "contradiction", "", "3.5", "-"]
words = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.floats() | words | st.sampled_from(LABELS),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(words, inner, max_size=3),
    max_leaves=8,
)


@st.composite
def data_files(draw) -> tuple[str, bytes]:
    """(extension, content) of a data file: rows of plausible columns in one of the formats,
    then mutated; or raw bytes."""
    ext = draw(st.sampled_from([".tsv", ".csv", ".jsonl", ".ndjson", ".json", ".JSONL", ".txt"]))
    if draw(st.integers(0, 9)) == 0:
        return ext, draw(st.binary(max_size=200))
    columns = draw(st.lists(st.sampled_from(COLUMNS) | words, min_size=1, max_size=4))
    cell = st.sampled_from(LABELS) | words
    rows = draw(st.lists(st.lists(cell, min_size=len(columns), max_size=len(columns)), max_size=5))
    if ext.lower() in (".tsv", ".csv", ".txt"):
        sep = "\t" if ext == ".tsv" else ","
        lines = [sep.join(columns)] + [sep.join(row) for row in rows]
        text = "\n".join(lines) + draw(st.sampled_from(["\n", "", "\r\n", "\n\n"]))
    else:
        objs = [{c: draw(json_values) if draw(st.booleans()) else v for c, v in zip(columns, row)} for row in rows]
        if draw(st.integers(0, 4)) == 0:
            objs.append(draw(json_values))  # a line that is not an object
        if ext == ".json" and draw(st.booleans()):
            text = json.dumps(objs)
        else:
            text = "".join(json.dumps(o) + "\n" for o in objs)
    return ext, draw(mutated(text))


TASK_LABELS = [(None, None), ("sst2", ("negative", "positive")), ("rte", ("entailment", "not_entailment")),
               ("mnli", ("entailment", "neutral", "contradiction")), (None, ("negative", "positive"))]


@budget(150)
@given(file=data_files(), task=st.sampled_from(TASK_LABELS))
def test_data_readers(tmp_path_factory, file, task):
    ext, content = file
    d = tmp_path_factory.mktemp("data")
    path = d / f"data{ext}"
    path.write_bytes(content)
    digest = _sha(path)
    name, label_names = task
    try:
        examples, names = load_examples(str(path), get_task(name) if name else None, label_names)
    except AttattrError as exc:
        assert "\n" not in str(exc), str(exc)
    else:
        assert examples and all(isinstance(e.text_a, str) for e in examples)
    assert _sha(path) == digest


@budget(40)
@given(file=data_files(), task=st.sampled_from([None, "sst2"]))
def test_score_data(tmp_path_factory, tiny_model_dir, file, task):
    """`score --data` through the CLI; --examples past the end keeps any file from being scored."""
    ext, content = file
    d = tmp_path_factory.mktemp("score")
    path = d / f"data{ext}"
    path.write_bytes(content)
    args = ["score", "--model", tiny_model_dir, "--data", path, "--out", d / "s.h5", "--examples", 99999, "-q"]
    result = _run(*args, *(["--task", task] if task else []))
    check_contract(result, {path: _sha(path)})
    assert result.exit_code != 0 and not (d / "s.h5").exists()


# -- the 2021 JSON importer -----------------------------------------------------------------

TOKENS = ["[CLS]", "[SEP]", "the", "cat", "##s", "a", "[PAD]", ""]
numbers = st.floats(width=32) | st.integers(-3, 3) | st.sampled_from([0.5, -1.25, 1e30])


@st.composite
def legacy_files(draw) -> tuple[bytes, bytes, int | None]:
    """(attribution file, tokens file, --example or None): a consistent 2021 pair, then
    changed: shapes, entries and their fields, the text bytes."""
    layers, heads, n = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 4))
    lines = []
    for _ in range(layers):
        h = heads if draw(st.integers(0, 9)) else draw(st.integers(0, 3))
        m = n if draw(st.integers(0, 9)) else draw(st.integers(0, 5))
        layer = [[[draw(numbers) for _ in range(m)] for _ in range(m)] for _ in range(h)]
        lines.append(json.dumps(layer) if draw(st.integers(0, 14)) else json.dumps(draw(json_values)))
    attr = "".join(line + "\n" for line in lines)
    count = draw(st.integers(1, 3))
    entries = []
    for k in range(count):
        entry = {"index": k, "tokens": [draw(st.sampled_from(TOKENS)) for _ in range(n)],
                 "pred": draw(st.sampled_from(["entailment", "neutral", "contradiction", "0", "x"])),
                 "golden": draw(st.sampled_from(["entailment", "neutral", "contradiction", "y"])),
                 "pred_logits": [[draw(numbers) for _ in range(draw(st.integers(0, 4)))]]}
        for key in list(entry):
            change = draw(st.integers(0, 14))
            if change == 0:
                del entry[key]
            elif change == 1:
                entry[key] = draw(json_values)
        entries.append(entry)
    shape = draw(st.sampled_from(["list", "lines", "object"]))
    if shape == "list":
        tokens = json.dumps(entries)
    elif shape == "lines":
        tokens = "".join(json.dumps(e) + "\n" for e in entries)
    else:
        tokens = json.dumps(entries[0])
    example = draw(st.none() | st.integers(-1, 4))
    return draw(mutated(attr)), draw(mutated(tokens)), example


@budget(120)
@given(files=legacy_files(), labels=st.sampled_from([None, "a,b,c", "x"]), attention=st.booleans(),
       again=st.booleans())
def test_import_json(tmp_path_factory, files, labels, attention, again):
    attr, tokens, example = files
    d = tmp_path_factory.mktemp("legacy")
    attr_path = d / "attr_zero_base_exp0.json"
    tokens_path = d / "tokens_and_pred_3.json"
    attr_path.write_bytes(attr)
    tokens_path.write_bytes(tokens)
    inputs = {attr_path: _sha(attr_path), tokens_path: _sha(tokens_path)}
    args = ["import-json", attr_path, tokens_path, "--out", d / "s.h5"]
    if example is not None:
        args += ["--example", example]
    if labels:
        args += ["--labels", labels]
    if attention:
        args += ["--attention", attr_path]
    for _ in range(2 if again else 1):  # a second run finds the example already there
        result = _run(*args)
        check_contract(result, inputs)
    if result.exit_code == 0:
        info = _run("info", d / "s.h5")
        check_contract(info, {d / "s.h5": _sha(d / "s.h5")})


# -- the store opener --------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def _no_writer_to_wait_for():
    """A store read that fails waits ``reader._SETTLE`` seconds for a writer changing the file
    before it is an error (docs/store.md, "Readers during a write"); no writer runs here, so
    the damaged stores fail at once (tests/test_store_hardening.py holds the wait itself)."""
    from attattr_cli.store import reader

    settle, reader._SETTLE = reader._SETTLE, 0.0
    yield
    reader._SETTLE = settle


@pytest.fixture(scope="module")
def base_store(tmp_path_factory):
    """A small real store of the built-in default (2 examples, 2 steps), and where its
    attributes are: [(object path, attribute name)]."""
    p = tmp_path_factory.mktemp("fuzz-store") / "s.h5"
    result = _run("score", "--out", p, "--examples", "0:2", "--steps", 2, "-q")
    assert result.exit_code == 0, result.output
    places = []
    with h5py.File(p, "r") as f:
        places += [("/", name) for name in f.attrs]

        def visit(name, obj):
            places.extend((name, attr) for attr in obj.attrs)

        f.visititems(visit)
    assert places
    return BaseStore(p, p.read_bytes(), places)


class BaseStore:
    """The store to mutate (a short repr: hypothesis prints it with a failing input)."""

    def __init__(self, path: Path, data: bytes, places: list[tuple[str, str]]):
        self.path, self.data, self.places = path, data, places

    def __repr__(self) -> str:
        return f"BaseStore({self.path.name}, {len(self.data)} bytes)"


def _open_store(path: Path) -> None:
    digest = _sha(path)
    for args in (["info", path], ["tree", path, "--example", 0, "--format", "json", "-q"]):
        check_contract(_run(*args), {path: digest})


def _fresh() -> tuple[Path, Path]:
    d = Path(tempfile.mkdtemp(prefix="fuzz-store-"))
    return d, d / "m.h5"


@budget(40)
@given(cut=st.floats(0, 1, exclude_max=True))
def test_store_truncated(base_store, cut):
    data = base_store.data
    d, path = _fresh()
    try:
        path.write_bytes(data[: int(len(data) * cut)])
        _open_store(path)
    finally:
        shutil.rmtree(d)


NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]  # part B cases: report the first, quickly


@settings(budget(40), phases=NO_SHRINK)
@given(flips=st.lists(st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 7)), min_size=1, max_size=8))
def test_store_bit_flipped(base_store, flips):
    data = base_store.data
    d, path = _fresh()
    try:
        b = bytearray(data)
        for where, bit in flips:
            b[int(len(b) * where)] ^= 1 << bit
        path.write_bytes(bytes(b))
        _open_store(path)
    finally:
        shutil.rmtree(d)


retyped = st.one_of(
    st.integers(-(2**40), 2**40), st.floats(), st.binary(max_size=8), words,
    st.sampled_from(["", "{", "[]", "null", "{}", '{"a": 1}', "99.0", "attattr.store", "1.1"]),
    st.lists(st.integers(0, 9), min_size=1, max_size=3).map(np.asarray),
)


@settings(budget(60), phases=NO_SHRINK)
@given(data=st.data())
def test_store_attributes_removed_or_retyped(base_store, data):
    src, places = base_store.path, base_store.places
    where, name = data.draw(st.sampled_from(places))
    d, path = _fresh()
    try:
        shutil.copyfile(src, path)
        with h5py.File(path, "r+") as f:
            obj = f[where]
            if data.draw(st.booleans()):
                del obj.attrs[name]
            else:
                obj.attrs[name] = data.draw(retyped)
        _open_store(path)
    finally:
        shutil.rmtree(d)
