"""Arguments of the public API, checked from one declaration per function (api/checks.py):
a wrong type or range is one AttattrError naming the argument, raised before any work, and
nothing is coerced (a bool or 1.7 is no index, "0.1" no number, "0" no list of layers); the
API names arguments and the CLI flags, from one table (attattr_cli/names.py).

The generated part (hypothesis) draws a fixed sequence of 20 values per function and per
command in CI (about half a minute in all); ATTATTR_ARGS_EXAMPLES=N draws N fresh ones."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import attattr_cli as aa
from attattr_cli.errors import AttattrError, ModelError, OptionError


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """Two built-in examples scored with a fixed rule of 2 steps (all 3 layers)."""
    out = tmp_path_factory.mktemp("args") / "s.h5"
    aa.score(out=out, examples="0:2", steps=2)
    return out


def _files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*")}


# the misuse the issue lists, each with the argument the one line must name
MISUSE = [
    ("view", lambda s: aa.view(s, "abc", "v.png"), "example", "got 'abc'"),
    ("view", lambda s: aa.view(s, None, "v.png"), "example", "got None"),
    ("view", lambda s: aa.view(s, 1.7, "v.png"), "example", "got 1.7"),
    ("view", lambda s: aa.view(s, True, "v.png"), "example", "got True"),
    ("view", lambda s: aa.view(s, 0, "v.png", layers="0"), "layers", "got '0'"),
    ("view", lambda s: aa.view(s, 0, "v.png", layers=[0.5]), "layers", "got [0.5]"),
    ("view", lambda s: aa.view(s, 0, "v.png", show=5), "show", "got 5"),
    ("view", lambda s: aa.view(s, 0, 123), "out", "got 123"),
    ("report", lambda s: aa.report(s, None), "out", "got None"),
    ("report", lambda s: aa.report(s, 123), "out", "got 123"),
    ("report", lambda s: aa.report(s, "r.html", importance=5), "importance", "got 5"),
    ("synthetic_data", lambda s: aa.synthetic_data(None), "out", "got None"),
    ("synthetic_data", lambda s: aa.synthetic_data(123), "out", "got 123"),
    ("synthetic_data", lambda s: aa.synthetic_data("d.tsv", count=True), "count", "got True"),
    ("synthetic_data", lambda s: aa.synthetic_data("d.tsv", count=0), "count", "at least 1, got 0"),
    ("train_default", lambda s: aa.train_default(None), "out", "got None"),
    ("train_default", lambda s: aa.train_default(123), "out", "got 123"),
    ("train_default", lambda s: aa.train_default("a_file"), "out", "(a file)"),
    ("train_default", lambda s: aa.train_default("m", seed="x"), "seed", "got 'x'"),
    ("score", lambda s: aa.score(out="x.h5", tol="0.1"), "tol", "got '0.1'"),
    ("score", lambda s: aa.score(out="x.h5", max_nodes=None), "max_nodes", "got None"),
    ("score", lambda s: aa.score(out="x.h5", steps=2.0), "steps", "got 2.0"),
    ("score", lambda s: aa.score(inputs=["a text"], layers=True), "layers", "got True"),
    ("faithfulness", lambda s: aa.faithfulness(s, methods=5), "methods", "got 5"),
    ("faithfulness", lambda s: aa.faithfulness(s, adversarial=True, epsilons="0.05"), "epsilons", "got '0.05'"),
    ("faithfulness", lambda s: aa.faithfulness(s, adversarial=True, epsilons=0.05), "epsilons", "got 0.05"),
    ("faithfulness", lambda s: aa.faithfulness(s, adversarial=True, epsilons=["abc"]), "epsilons", "got ['abc']"),
    ("faithfulness", lambda s: aa.faithfulness(s, adversarial=True, adversarial_layer="x"), "adversarial_layer", "'x'"),
    ("faithfulness", lambda s: aa.faithfulness(s, permutations="5"), "permutations", "got '5'"),
    ("faithfulness", lambda s: aa.faithfulness(store=123), "store", "got 123"),
    ("faithfulness", lambda s: aa.faithfulness(s, examples=[1.5]), "examples", "got [1.5]"),
    ("merge", lambda s: aa.merge([s], None), "out", "got None"),
    ("merge", lambda s: aa.merge(s, "m.h5"), "shards", "a list of file paths"),
    ("tree", lambda s: aa.tree(s), "example", "a scored example"),
    ("importance", lambda s: aa.importance(s, batch_size=0), "batch_size", "at least 1, got 0"),
    ("triggers", lambda s: aa.triggers(s, top_k=1.0), "top_k", "got 1.0"),
    ("load_model", lambda s: aa.load_model(5), "source", "got 5"),
    ("open_store", lambda s: aa.open_store(None), "path", "got None"),
    ("view", lambda s: aa.view(s), "example", "missing a required argument"),
    ("view", lambda s: aa.view(s, 0, "v.png", colour="red"), "colour", "unexpected keyword argument"),
    ("faithfulness", lambda s: aa.faithfulness(s, examples=True), "examples", "got True"),
    ("attack", lambda s: aa.attack(triggers="t.json", alpha=1.5), "alpha", "above 0 and below 1, got 1.5"),
]


@pytest.mark.parametrize("name, call, argument, got", MISUSE, ids=[f"{m[0]}-{m[2]}-{i}" for i, m in enumerate(MISUSE)])
def test_misuse_is_one_error_naming_the_argument_and_writes_nothing(store, tmp_path, monkeypatch, name, call,
                                                                    argument, got):
    monkeypatch.chdir(tmp_path)
    Path("a_file").write_text("x")
    before = _files(tmp_path)
    with pytest.raises(AttattrError) as exc:
        call(store)
    text = str(exc.value)
    assert isinstance(exc.value, ModelError if name == "load_model" else OptionError), text
    assert "\n" not in text and argument in text and got in text, text
    assert not text.startswith("--") and f"--{argument}" not in text, text  # the API's words, not the flags
    assert _files(tmp_path) == before


def test_documented_shorthands_and_none_as_the_default(store, tmp_path):
    # one layer index is a list of one (as score takes it); a layer the store lacks is named
    one = aa.view(store, 0, fmt="svg", layers=1, tree=False)
    assert one.view.layers == [1]
    assert aa.view(store, 0, fmt="svg", layers=(1,), tree=False).view.layers == [1]
    with pytest.raises(OptionError, match="layer 5"):
        aa.view(store, 0, fmt="svg", layers=5, tree=False)
    # numpy integers are whole numbers; None where the default is None means the default
    import numpy as np

    assert aa.view(store, np.int64(0), fmt="svg", layers=None, tree=False).view.layers == [0, 1, 2]
    with aa.open_store(store) as s:
        assert s.get(np.int32(1)).index == 1
        with pytest.raises(OptionError, match="index must be a whole number, got 1.0"):
            s.get(1.0)


def test_every_argument_is_declared():
    """Each public function and each public method of a result that takes arguments checks
    them, and every argument has a declared kind (a new one cannot skip the checks)."""
    from attattr_cli.api.checks import declaration

    functions = public_functions()
    assert {"view", "report", "score", "faithfulness", "merge", "synthetic_data", "train_default", "tree",
            "importance", "prune", "triggers", "attack", "finetune", "import_2021", "load_model", "open_store",
            "info", "Importance.plot", "Tree.save", "StoreView.get"} <= set(functions)
    for name, fn in functions.items():
        assert hasattr(fn, "__checked__"), f"{name} has no @checked declaration"
        undeclared = [arg for arg, (kind, _) in declaration(fn).items() if kind is None]
        assert not undeclared, f"{name}: no kind declared for {undeclared}"


def public_functions() -> dict:
    """Every function of ``attattr_cli.api.__all__`` and every public method (with arguments)
    of the classes there, by name."""
    import inspect

    from attattr_cli import api

    out = {}
    for name in api.__all__:
        obj = getattr(api, name)
        if inspect.isclass(obj):
            for attr, member in vars(obj).items():
                fn = getattr(member, "__checked__", member)
                if attr.startswith("_") or not inspect.isfunction(fn):
                    continue
                params = [p for p in inspect.signature(fn).parameters.values()
                          if p.name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
                if params:
                    out[f"{name}.{attr}"] = member
        elif callable(obj):
            out[name] = obj
    return out


def test_a_refused_call_loads_nothing(tmp_path):
    """The checks run before the body: a wrong-typed call to a function that would load a
    model or read a store returns at once, without importing torch."""
    import subprocess
    import sys

    code = ("import sys, attattr_cli as aa\n"
            "from attattr_cli.errors import AttattrError\n"
            "for call in (lambda: aa.score(out='x.h5', tol='0.1'), lambda: aa.faithfulness(permutations='5'),\n"
            "             lambda: aa.prune(batch_size=0), lambda: aa.attack(alpha=2), lambda: aa.view('s.h5', 1.5, 'v.png')):\n"
            "    try:\n"
            "        call()\n"
            "    except AttattrError:\n"
            "        pass\n"
            "print('torch' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"
    assert os.listdir(tmp_path) == []


# ----------------------------------------------------------------------------- demo train --overwrite


def _fake_training(monkeypatch, fail: bool = False):
    """The default model's recipe replaced by one that writes a marker file (a real training
    takes minutes): what is under test is where train_default puts its result."""
    from attattr_cli.models import default

    def train(out_dir, *, seed=0, progress=None, threads=None):
        (Path(out_dir) / "config.json").write_text(f'{{"seed": {seed}}}')
        if fail:
            raise KeyboardInterrupt
        return {"heldout_accuracy": 1.0, "train_seconds": 0.0, "n_params": 0, "seed": seed}

    monkeypatch.setattr(default, "train_default_model", train)


def test_train_default_refuses_a_non_empty_folder_without_overwrite(tmp_path, monkeypatch):
    from conftest import one_error_line, run_cli

    _fake_training(monkeypatch)
    model = tmp_path / "model"
    model.mkdir()
    (model / "keep.txt").write_text("mine")
    line = one_error_line(run_cli("demo", "train", "--out", model, "-q"), "--overwrite", "not empty")
    assert "--out" in line
    with pytest.raises(OptionError) as exc:
        aa.train_default(model)
    assert "overwrite" in str(exc.value) and "--" not in str(exc.value)
    assert os.listdir(model) == ["keep.txt"] and sorted(os.listdir(tmp_path)) == ["model"]
    # a failed training leaves the old folder as it was, and no temporary folder beside it
    _fake_training(monkeypatch, fail=True)
    with pytest.raises(KeyboardInterrupt):
        aa.train_default(model, overwrite=True)
    assert os.listdir(model) == ["keep.txt"] and sorted(os.listdir(tmp_path)) == ["model"]
    # --overwrite replaces it once training succeeded; an empty or new folder needs none
    _fake_training(monkeypatch)
    r = run_cli("demo", "train", "--out", model, "--overwrite", "--seed", "3", "-q")
    assert r.exit_code == 0, r.output
    assert os.listdir(model) == ["config.json"] and (model / "config.json").read_text() == '{"seed": 3}'
    (tmp_path / "empty").mkdir()
    assert aa.train_default(tmp_path / "empty", seed=4)["seed"] == 4
    assert aa.train_default(tmp_path / "new", seed=5)["seed"] == 5
    assert (tmp_path / "new" / "config.json").read_text() == '{"seed": 5}'
    assert sorted(os.listdir(tmp_path)) == ["empty", "model", "new"]


# ----------------------------------------------------------------------------- names once: arguments and flags


# (API call, its message, the same misuse on the command line, its message): one table
# (attattr_cli/names.py) words both, whichever side wrote the message
SAME_MISUSE = [
    (lambda s: aa.synthetic_data("d.tsv", count=0), "count must be at least 1, got 0",
     ["demo", "data", "--out", "d.tsv", "--count", "0"], "--count must be at least 1, got 0"),
    (lambda s: aa.score(out="x.h5", steps_per_pass=0), "steps_per_pass must be at least 1",
     ["score", "--out", "x.h5", "--steps-per-pass", "0"], "--steps-per-pass must be at least 1"),
    (lambda s: aa.score(out="x.h5", dist_timeout=0), "dist_timeout must be above 0",
     ["score", "--out", "x.h5", "--dist-timeout", "0"], "--dist-timeout must be above 0"),
    (lambda s: aa.score(out="x.h5", tol=0.1, steps=3), "tol places its own nodes; it does not go with steps 3",
     ["score", "--out", "x.h5", "--tol", "0.1", "--steps", "3"], "--tol places its own nodes; it does not go with --steps 3"),
    (lambda s: aa.view(s, 0, "v.png", fmt="gif"), "unknown fmt 'gif'",
     ["view", "{store}", "-n", "0", "--out", "v.png", "--format", "gif"], "unknown --format 'gif'"),
    (lambda s: aa.prune(importance="imp.h5", keep_heads=0.5), "keep_heads and save_model go together",
     ["prune", "--out", "c.json", "--importance", "imp.h5", "--keep-heads", "0.5"], "--keep-heads and --save-model go together"),
    (lambda s: aa.faithfulness(s, erase="zero"), "unknown erase 'zero'",
     ["faithfulness", "{store}", "--out", "f.json", "--erase", "zero"], "unknown --erase 'zero'"),
]


@pytest.mark.parametrize("call, api_text, args, cli_text", SAME_MISUSE, ids=[c[1][:24] for c in SAME_MISUSE])
def test_the_api_names_arguments_and_the_cli_names_flags(store, tmp_path, monkeypatch, call, api_text, args, cli_text):
    from conftest import one_error_line, run_cli

    monkeypatch.chdir(tmp_path)
    with pytest.raises(OptionError) as exc:
        call(store)
    assert api_text in str(exc.value) and "--" not in str(exc.value), str(exc.value)
    line = one_error_line(run_cli(*[a.replace("{store}", str(store)) for a in args]), cli_text)
    assert line.startswith("Error: ")
    assert os.listdir(tmp_path) == []


def test_the_table_of_names_is_one_and_true():
    """Each entry of the table names an argument of the API (or a field of the scoring
    options) and a flag some command has; both directions read it."""
    import inspect
    from dataclasses import fields

    from attattr_cli import names
    from attattr_cli.engine.options import ScoreOptions

    arguments = {p for fn in public_functions().values()
                 for p in inspect.signature(getattr(fn, "__checked__", fn)).parameters}
    arguments |= {f.name for f in fields(ScoreOptions)}
    # the fields of the option groups (aa.Integration, aa.Compute, ...) are arguments too: score's and
    # faithfulness's old flat keywords
    arguments |= {f.name for cls in (aa.Integration, aa.Target, aa.Compute, aa.Hooks, aa.Adversarial) for f in fields(cls)}
    flags = {opt for _path, command in cli_commands() for p in command.params for opt in getattr(p, "opts", [])}
    flags |= {opt for _path, command in cli_commands() for p in command.params for opt in getattr(p, "secondary_opts", [])}
    for argument, flag in names.FLAGS.items():
        assert argument in arguments and flag in flags, (argument, flag)
        assert names.flag(argument) == flag
    for flag, argument in names.ARGUMENTS.items():
        assert flag in flags and (argument in arguments), (flag, argument)
        assert names.flag(argument) == flag or flag in ("--step-batch",)  # an old spelling: its argument's flag is new
    assert names.argument(names.flag("keep_heads")) == "keep_heads" and names.flag("keep_heads") == "--keep-heads"
    assert names.in_api_words("give --format or --steps-per-pass, not --step-batch") == \
        "give fmt or steps_per_pass, not steps_per_pass"
    assert names.in_cli_words("fmt and keep_heads go together", ["fmt", "keep_heads"]) == \
        "--format and --keep-heads go together"
    from attattr_cli.engine import options

    assert options.api_names is names.api_names and options.cli_words is names.cli_words


def cli_commands():
    """(command path, click command) of every command of the Typer app, groups walked."""
    import typer

    from attattr_cli.cli import app

    root = typer.main.get_command(app)
    out = []

    def walk(cmd, path):
        subs = getattr(cmd, "commands", None)
        if subs:
            for name, sub in subs.items():
                walk(sub, [*path, name])
        else:
            out.append((path, cmd))

    walk(root, [])
    return out


# ----------------------------------------------------------------------------- wrong types, generated
#
# For every argument of every public function (and result method), enumerated from
# attattr_cli.api.__all__ and their declarations, and for every typed option of every
# command, enumerated from the Typer app: values of a wrong type give one AttattrError (one
# `Error:` line), and nothing is written. Each call runs in a fresh folder; the checks run
# before any work, so no model loads and the whole run takes seconds.

import contextlib  # noqa: E402
import tempfile  # noqa: E402

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

GENERATED = settings(max_examples=int(os.environ.get("ATTATTR_ARGS_EXAMPLES", "20")), deadline=None, database=None,
                     derandomize=not os.environ.get("ATTATTR_ARGS_EXAMPLES"),
                     suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])

# values of every type a caller may pass by mistake
ANY_VALUE = st.one_of(
    st.none(), st.booleans(), st.integers(-10, 10**6), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6), st.binary(max_size=3), st.just(""), st.just(float("nan")),
    st.lists(st.one_of(st.floats(allow_nan=True), st.text(max_size=2), st.booleans(), st.none()), max_size=3),
    st.tuples(st.integers(), st.floats()), st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.builds(object), st.sets(st.integers(), max_size=2), st.complex_numbers(max_magnitude=2),
)


def _api_cases() -> list[tuple[str, object, dict, str, object, bool]]:
    """(function name, function, its required arguments filled with valid samples, argument,
    kind, None taken) for every declared argument of every public function and method."""
    from attattr_cli.api.checks import declaration

    cases = []
    for name, fn in public_functions().items():
        decl = declaration(fn)
        import inspect

        params = inspect.signature(getattr(fn, "__checked__", fn)).parameters
        required = {arg: kind.sample for arg, (kind, _) in decl.items()
                    if params[arg].default is inspect.Parameter.empty}
        if "." in name:  # a method: called unbound, on no instance (the checks come first)
            required = {"self": None, **required}
        for arg, (kind, none_ok) in decl.items():
            cases.append((name, fn, required, arg, kind, none_ok))
    return cases


API_CASES = _api_cases()


def _refused(kind, none_ok: bool, value) -> bool:
    return not ((value is None and none_ok) or kind.accepts(value))


@contextlib.contextmanager
def _fresh_folder():
    """A new empty working folder; yields a function that lists what appeared in it."""
    old = os.getcwd()
    with tempfile.TemporaryDirectory() as d:
        os.chdir(d)
        try:
            yield lambda: sorted(os.listdir(d))
        finally:
            os.chdir(old)


def _call_refused(name, fn, required, arg, value):
    kwargs = dict(required)
    kwargs[arg] = value
    with _fresh_folder() as written:
        with pytest.raises(AttattrError) as exc:
            fn(**kwargs)
        assert written() == [], f"{name}({arg}={value!r}) wrote {written()}"
    text = str(exc.value)
    assert "\n" not in text and (text.startswith(f"{arg} ") or f" {arg} " in text), (name, arg, value, text)


def test_samples_are_taken_and_every_kind_refuses_some_object():
    """The samples the generated calls fill in are valid, and a plain object() is refused by
    every kind: each argument of each function is refused at least once below."""
    assert len(API_CASES) > 150
    for name, fn, required, arg, kind, none_ok in API_CASES:
        assert kind.accepts(kind.sample), (name, arg, kind.sample)
        assert not kind.accepts(object()), (name, arg)


@pytest.mark.parametrize("case", API_CASES, ids=[f"{c[0]}-{c[3]}" for c in API_CASES])
def test_every_argument_refuses_a_foreign_object(case):
    name, fn, required, arg, kind, none_ok = case
    _call_refused(name, fn, required, arg, object())


@pytest.mark.parametrize("fname", sorted({c[0] for c in API_CASES}))
@GENERATED
@given(data=st.data())
def test_generated_wrong_values_are_one_error_and_write_nothing(fname, data):
    cases = [c for c in API_CASES if c[0] == fname]
    name, fn, required, arg, kind, none_ok = data.draw(st.sampled_from(cases), label="argument")
    value = data.draw(ANY_VALUE, label=arg)
    with _fresh_folder():  # where the call runs (a path's kind may depend on what exists)
        assume(_refused(kind, none_ok, value))
    _call_refused(name, fn, required, arg, value)


def _cli_options() -> list[tuple[list[str], str, str]]:
    """(command path, flag, what it takes) of every option of every command whose value has a
    type the parser checks: whole numbers, numbers, and on/off flags (which take no value).
    Text and path options take any text; the API's checks above refuse their wrong values."""
    import typing

    out = []
    for path, command in cli_commands():
        for p in command.params:
            opts = [o for o in getattr(p, "opts", []) if o.startswith("--")]
            if not opts or getattr(p, "param_type_name", "option") != "option":
                continue
            annotation = getattr(getattr(p, "type_descriptor", None), "annotation", None)
            base = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
            if getattr(p, "is_flag", False) or base[0] is bool:
                out.append((path, opts[0], "flag"))
            elif base[0] in (int, float):
                out.append((path, opts[0], base[0].__name__))
    return out


CLI_OPTIONS = _cli_options()
# texts that no number parser takes (no digit alone, no inf/nan/e)
NOT_A_NUMBER = st.text(alphabet="bcdghjklmopqrsuvwxyz!@#%_., 0123456789", min_size=1, max_size=6).filter(
    lambda t: any(c.isalpha() or c in "!@#%_" for c in t) and not t.startswith(" "))


def _one_cli_error(args: list[str]) -> None:
    from conftest import one_error_line, run_cli

    with _fresh_folder() as written:
        result = run_cli(*args)
        assert written() == [], f"attattr {' '.join(args)} wrote {written()}"
    one_error_line(result)
    assert result.exit_code == 2, (args, result.exit_code, result.stderr)


def test_every_command_has_typed_options_under_test():
    commands = {" ".join(path) for path, _ in cli_commands()}
    covered = {" ".join(path) for path, _, _ in CLI_OPTIONS}
    assert commands == covered, commands - covered  # every command has at least -q or a number
    assert {"int", "float", "flag"} == {what for _, _, what in CLI_OPTIONS}


@pytest.mark.parametrize("command", sorted({" ".join(c[0]) for c in CLI_OPTIONS}))
@GENERATED
@given(data=st.data())
def test_generated_wrong_option_values_are_one_error_line_and_write_nothing(command, data):
    options = [c for c in CLI_OPTIONS if " ".join(c[0]) == command]
    path, flag, what = data.draw(st.sampled_from(options), label="option")
    if what == "flag":
        args = [*path, f"{flag}={data.draw(st.sampled_from(['1', 'x', 'yes', '']), label='value')}"]
    else:
        args = [*path, f"{flag}={data.draw(NOT_A_NUMBER, label='value')}"]
    _one_cli_error(args)


def test_usage_errors_are_one_line(tmp_path):
    """An unknown command or option, and a missing argument, are one Error line too."""
    for args in (["nocommand"], ["score", "--no-such-option"], ["info"], ["demo", "nothing"],
                 ["view", "s.h5", "-n", "1.5", "-o", "v.png"]):
        _one_cli_error(args)


def test_arrays_are_arrays_of_numbers():
    from attattr_cli.api.checks import Array

    import numpy as np

    assert Array().accepts([[1, 0.5]]) and Array().accepts(np.ones((2, 2))) and Array().accepts((1.0, 2.0))
    assert not any(Array().accepts(v) for v in ([["a"]], [[1], [1, 2]], 3.0, "12", None, {"a": 1}))


def test_numpy_numbers_are_numbers(store):
    """numpy integers and floats pass as the Python numbers they are (the engine's own
    validators see Python's), numpy booleans are no numbers."""
    import numpy as np

    from attattr_cli.api.checks import Examples, Int, Ints, Number, Numbers

    assert type(Int().check(np.int64(2))) is int and type(Number().check(np.float32(0.5))) is float
    assert Ints().check([np.int32(1), 2]) == [1, 2] and all(type(x) is int for x in Ints().check(np.arange(2)))
    assert Examples().check(np.array([3, 4])) == [3, 4] and Numbers().check(np.float64(0.1)) == [0.1]
    assert not Int().accepts(np.bool_(True)) and not Number().accepts(np.bool_(False))
    picture = aa.view(store, np.int64(1), fmt="svg", layers=np.array([0, 2]), tree=False)
    assert picture.view.layers == [0, 2]
    imp = aa.importance(store, methods="attr", examples=np.array([0, 1]))
    assert imp.used == 2


# the text options a command parses itself into lists of numbers (the other text and path
# options take any text): garbage is one Error line before any work, nothing written
TEXT_LIST_OPTIONS = [
    (["score", "--out", "x.h5"], "--layers"), (["score", "--out", "x.h5"], "--examples"),
    (["view", "s.h5", "-n", "0", "-o", "v.png"], "--layers"), (["view", "s.h5", "-n", "0", "-o", "v.png"], "--queries"),
    (["tree", "s.h5", "-n", "0"], "--layers"), (["importance", "s.h5", "--out", "i.h5"], "--seeds"),
    (["prune", "--out", "c.json", "--importance", "imp.h5"], "--ks"),
    (["prune", "--out", "c.json", "--importance", "imp.h5"], "--rates"),
    (["faithfulness", "s.h5", "--out", "f.json"], "--perm-layers"),
    (["faithfulness", "s.h5", "--out", "f.json", "--adversarial"], "--epsilons"),
]


@GENERATED
@given(data=st.data())
def test_generated_garbage_in_list_options_is_one_error_line(data):
    args, option = data.draw(st.sampled_from(TEXT_LIST_OPTIONS), label="option")
    _one_cli_error([*args, f"{option}={data.draw(NOT_A_NUMBER, label='value')}"])


# ----------------------------------------------------------------------------- the option groups' fields


def _group_fields():
    """(group, field, the old flat keywords of it: (function, keyword)) for every field of every
    option group (api/groups.py)."""
    from dataclasses import fields

    from attattr_cli.api.scoring import SCORE_GROUPS, SCORE_LEGACY
    from attattr_cli.api.tools import FAITHFULNESS_GROUPS, FAITHFULNESS_LEGACY

    out = []
    for cls in (aa.Integration, aa.Target, aa.Compute, aa.Hooks, aa.Adversarial):
        for f in fields(cls):
            old = [(fn, keyword) for fn, table, groups in ((aa.score, SCORE_LEGACY, SCORE_GROUPS),
                                                           (aa.faithfulness, FAITHFULNESS_LEGACY, FAITHFULNESS_GROUPS))
                   for keyword, (arg, field) in table.items() if groups[arg] is cls and field == f.name]
            out.append((cls, f.name, old))
    return out


GROUP_FIELDS = _group_fields()


@pytest.mark.parametrize("cls, name, old", GROUP_FIELDS, ids=[f"{c.__name__}-{n}" for c, n, _ in GROUP_FIELDS])
def test_every_field_of_every_group_refuses_a_foreign_object(cls, name, old):
    """A group's field is checked when the group is made, and its old flat keyword when the
    function is called: one error naming it (the field's or the keyword's name), nothing written."""
    with pytest.raises(OptionError) as exc:
        cls(**{name: object()})
    assert str(exc.value).startswith(f"{name} must be "), str(exc.value)
    for fn, keyword in old:
        with _fresh_folder() as written:
            with pytest.raises(OptionError) as exc:
                fn(**{keyword: object()})
            assert written() == []
        assert str(exc.value).startswith(f"{keyword} must be "), str(exc.value)


def test_every_old_keyword_is_a_field_of_a_group():
    """score's 43 parameters and faithfulness's 27: each is a parameter still, or an old
    keyword that names a group's field."""
    import inspect

    from attattr_cli.api.scoring import SCORE_LEGACY
    from attattr_cli.api.tools import FAITHFULNESS_LEGACY

    before = {
        aa.score: "model inputs data task examples out steps rule tol max_nodes target output layers steps_per_pass group"
                  " family keep top_k dtype kernel device store_dtype truncate seed lm target_token continuation position"
                  " prompts keep_shards dist_timeout progress command warn foil generate per_step sample metric sources"
                  " memory threads notify",
        aa.faithfulness: "store model data task examples methods score_store importance_store steps rule tol target output"
                         " erase permutations perm_layers seed adversarial epsilons adversarial_layer device truncate out"
                         " progress command aggregate threads",
    }
    for fn, table in ((aa.score, SCORE_LEGACY), (aa.faithfulness, FAITHFULNESS_LEGACY)):
        now = set(inspect.signature(fn.__checked__).parameters) - {"legacy"}
        assert set(before[fn].split()) <= now | set(table), set(before[fn].split()) - now - set(table)
        assert len(now) <= 20 and not now & set(table)
