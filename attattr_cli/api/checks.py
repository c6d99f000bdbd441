"""The arguments of the public API, declared once per function and checked before any work.

Every public function (and public method taking arguments) carries one ``@checked(...)`` line
naming the kind of each argument its annotation (``int``, ``float``, ``bool``, ``str``, each
optionally ``| None``) does not already say::

    @checked(store=File(), example=Int(), out=Out(), layers=Ints(), show=Names())
    def view(store, example: int, out=None, *, fmt: str | None = None, ...): ...

A refused argument is one :class:`~attattr_cli.errors.OptionError` (:class:`ModelError` for a
model of the wrong type) in the API's words, before anything is read, loaded or written; the CLI
shows it with the flag (:mod:`attattr_cli.names`), and the body runs inside
:func:`attattr_cli.names.api_names`, so what it raises names the API's arguments too. What is
taken and what is refused: docs/api.md, "Arguments are checked". :func:`declaration` lists the
declarations, from which tests/test_arguments.py generates wrong values."""

from __future__ import annotations

import functools
import inspect
import math
import numbers
import os
import reprlib
import sys
import typing

from ..errors import OptionError
from ..fileio import is_stream
from ..names import api_names

_repr = reprlib.Repr()
_repr.maxstring, _repr.maxother, _repr.maxlist, _repr.maxtuple, _repr.maxdict = 40, 40, 4, 4, 3


class Refused(Exception):
    """A value of the wrong type or range: ``why`` is what it must be, ``note`` an addition."""

    def __init__(self, why: str, note: str = ""):
        super().__init__(why)
        self.why, self.note = why, note


class Kind:
    """What an argument takes. ``check`` returns the value (or its normal form, for a
    documented shorthand) or raises :class:`Refused`; by default it takes what ``ok`` says
    yes to, as it is. ``what`` says it in words; ``sample`` is a value it takes (the tests fill
    required arguments with it)."""

    what = "a value"
    error = OptionError
    sample: typing.Any = None

    def ok(self, value) -> bool:
        return True

    def check(self, value):
        if not self.ok(value):
            self.refuse()
        return value

    def accepts(self, value) -> bool:
        try:
            self.check(value)
        except Refused:
            return False
        return True

    def refuse(self, note: str = ""):
        raise Refused(self.what, note)


def _is_bool(value) -> bool:
    return isinstance(value, bool) or (type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"))


def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not _is_bool(value)


def _is_number(value) -> bool:
    return isinstance(value, numbers.Real) and not _is_bool(value)


def _bounds(least, most, above=None, below=None) -> str:
    parts = []
    if least is not None:
        parts.append(f"at least {least:g}")
    if above is not None:
        parts.append(f"above {above:g}")
    if most is not None:
        parts.append(f"at most {most:g}")
    if below is not None:
        parts.append(f"below {below:g}")
    return " and ".join(parts)


class Int(Kind):
    """A whole number (not a bool, not a float such as 1.0), optionally within bounds."""

    sample = 1

    def __init__(self, min: int | None = None, max: int | None = None, what: str = "a whole number"):
        self.min, self.max = min, max
        self.what = f"{what} of {_bounds(min, max)}" if min is not None or max is not None else what
        self.sample = next(x for x in (1, 0, 5, 100, -1) if self.accepts(x))

    def check(self, value):
        if not _is_int(value):
            self.refuse()
        if (self.min is not None and value < self.min) or (self.max is not None and value > self.max):
            raise Refused(_bounds(self.min, self.max))
        return int(value)  # a numpy integer as Python's


class Threads(Int):
    """torch's CPU threads for a run: 1 to this machine's CPUs (engine/threads.py ``most``);
    None, where the default is None, lets the run choose."""

    def __init__(self):
        from ..engine.threads import most

        super().__init__(min=1, max=most())

    def check(self, value):
        try:
            return super().check(value)
        except Refused as why:
            if _is_int(value):
                raise Refused(why.why, f"(this machine has {self.max} CPUs)") from None
            raise


class Seed(Int):
    """A random seed: what numpy's and torch's generators take, 0 <= seed < 2**32."""

    def __init__(self):
        super().__init__(min=0, max=2**32 - 1)
        self.what = "a whole number from 0 to 2**32 - 1"

    def check(self, value):
        try:
            return super().check(value)
        except Refused:
            raise Refused(self.what) from None


class Number(Kind):
    """A finite real number (an int is one; a bool or a string such as "0.1" is not)."""

    sample = 0.5

    def __init__(self, min: float | None = None, max: float | None = None, *, above: float | None = None,
                 below: float | None = None, what: str = "a number"):
        self.min, self.max, self.above, self.below = min, max, above, below
        self.what = f"{what} {_bounds(min, max, above, below)}" if (min, max, above, below) != (None,) * 4 else what
        self.sample = next(x for x in (0.5, 1.0, 0.0, 0.01, 5.0, -1.0) if self.accepts(x))

    def check(self, value):
        if not _is_number(value):
            self.refuse()
        if not math.isfinite(value):
            self.refuse("(not finite)")
        if ((self.min is not None and value < self.min) or (self.max is not None and value > self.max)
                or (self.above is not None and not value > self.above)
                or (self.below is not None and not value < self.below)):
            raise Refused(_bounds(self.min, self.max, self.above, self.below))
        return int(value) if _is_int(value) else float(value)  # numpy scalars as Python's


class Tolerance(Number):
    """A tolerance: a finite number > 0 (the one message the API and every command give)."""

    def __init__(self):
        super().__init__(what="a finite number > 0")

    def check(self, value):
        if not _is_number(value) or not math.isfinite(value) or not value > 0:
            self.refuse()
        return float(value)


class Bool(Kind):
    what, sample = "True or False", True

    def ok(self, value) -> bool:
        return _is_bool(value)


class Str(Kind):
    """A text (optionally one of ``choices``)."""

    sample = "x"

    def __init__(self, choices=None, what: str = "a text"):
        self.choices = None if choices is None else tuple(choices)
        self.what = what if self.choices is None else f"one of {', '.join(self.choices)}"
        if self.choices:
            self.sample = self.choices[0]

    def ok(self, value) -> bool:
        return isinstance(value, str) and (self.choices is None or value in self.choices)


def is_path(value) -> bool:
    return (isinstance(value, str) or isinstance(value, os.PathLike)) and str(os.fspath(value)) != ""


class File(Kind):
    """A path to read (a text or ``pathlib.Path``, not empty). Whether it exists is the
    reader's to say (its own error, e.g. StoreError for a store)."""

    what, sample = "a file path", "input.h5"

    def ok(self, value) -> bool:
        return is_path(value) and not isinstance(os.fspath(value), bytes)


# the suffixes of an attribution store's name
STORE_SUFFIXES = (".h5", ".hdf5")


class Out(File):
    """A path to write: a file (an existing folder is refused), or with ``folder`` a folder
    (an existing file is refused), or with ``either`` a file or a folder."""

    def __init__(self, folder: bool = False, either: bool = False):
        self.folder, self.either = folder, either
        self.what = ("a file or folder path" if either else "a folder path" if folder else "a file path")
        self.sample = "out_folder" if folder else "out.file"

    def check(self, value):
        super().check(value)
        if not self.either:
            if not self.folder and os.path.isdir(value):
                self.refuse("(a folder)")
            if self.folder and os.path.exists(value) and not os.path.isdir(value):
                self.refuse("(a file)")
        if not self.folder and str(os.fspath(value)) != "-":
            folder = os.path.dirname(os.path.abspath(os.fspath(value)))
            if not os.path.isdir(folder):  # as every command's --out: the folder is never made on the way
                self.refuse(f"(the folder {os.path.dirname(os.fspath(value)) or folder} does not exist)")
            if os.path.splitext(os.fspath(value))[1].lower() in STORE_SUFFIXES and is_stream(value):
                self.refuse("(a device, a FIFO or a socket: a store is a regular file, written where it lies)")
        return value


def _items(value):
    """A list of the items of a list, tuple, range or 1-d array; None for anything else."""
    if isinstance(value, (list, tuple, range)):
        return list(value)
    if type(value).__name__ == "ndarray" and getattr(value, "ndim", None) == 1:
        return value.tolist()
    return None


class Ints(Kind):
    """Whole numbers: a list (tuple, range, 1-d array) of them, or one (``single``, as a
    list of one). A text such as "0,3" is refused (the CLI parses those)."""

    def __init__(self, min: int | None = None, single: bool = True, text: bool = False, what: str | None = None,
                 sample=(0,)):
        self.min, self.single, self.text = min, single, text
        self.sample = list(sample) if min is None else [max(min, x) for x in sample]
        self.what = what or ("a whole number or a list of whole numbers" if single else "a list of whole numbers")
        if text:
            self.what += " (or a comma-separated text of them)"

    def check(self, value):
        if self.text and isinstance(value, str):
            try:
                value = [int(x) for x in value.split(",") if x.strip()]
            except ValueError:
                self.refuse()
        items = [value] if self.single and _is_int(value) else _items(value)
        if items is None or not all(_is_int(x) for x in items):
            self.refuse()
        if self.min is not None and any(x < self.min for x in items):
            raise Refused(f"whole numbers of at least {self.min}")
        return [int(x) for x in items]


class Numbers(Kind):
    """Finite numbers: a list (tuple, 1-d array) of them, or (``single``) one, as a list of one."""

    def __init__(self, *, above=None, below=None, single: bool = True, what: str | None = None, sample=(0.5,)):
        self.item, self.single = Number(above=above, below=below), single
        self.sample = list(sample)
        self.what = what or ("a number or a list of numbers" if single else "a list of numbers") + (
            "" if above is None and below is None else f" {_bounds(None, None, above, below)}")

    def check(self, value):
        items = [value] if self.single and _is_number(value) else _items(value)
        if items is None or not items or not all(_is_number(x) for x in items):
            self.refuse()
        return [self.item.check(x) for x in items]


class Texts(Kind):
    """A list of texts (a command line); the base of the kinds that take a list of items."""

    what, sample, empty = "a list of texts", ["attattr"], True

    def item(self, value) -> bool:
        return isinstance(value, str)

    def ok(self, value) -> bool:
        items = _items(value)
        return items is not None and bool(items or self.empty) and all(self.item(x) for x in items)


class Names(Texts):
    """Names: a text (one name, or several separated by commas) or a list of texts."""

    what, sample = "a name, a comma-separated text of names or a list of names", "x"

    def ok(self, value) -> bool:
        return isinstance(value, str) or super().ok(value)


class Files(Texts):
    """Paths: a list (or tuple) of file paths; a single path is refused (it is not a list)."""

    what, sample, empty = "a list of file paths", ["input.h5"], False

    def item(self, value) -> bool:
        return File().accepts(value)


class Examples(Kind):
    """A selection of examples: a text such as "0:100" or "3,7,9", or a list of indices."""

    what, sample = "a selection such as '0:100' or a list of whole numbers", "0:2"

    def check(self, value):
        if isinstance(value, str):
            return value
        items = _items(value)
        if items is None or not all(_is_int(x) for x in items):
            self.refuse()
        return [int(x) for x in items]


def loaded_type(module: str, name: str):
    """The class ``name`` of ``module`` when that module is imported (a value cannot be one
    of its instances otherwise): lets a check name torch-backed types without importing torch."""
    mod = sys.modules.get(module)
    return getattr(mod, name, None) if mod is not None else None


class Instance(Kind):
    """An instance of one of ``types`` (given as classes, or as "module:Name" for types whose
    module may not be imported yet)."""

    def __init__(self, *types, what: str):
        self.types, self.what = types, what
        first = types[0]
        self.sample = first if isinstance(first, str) else first.__new__(first)  # an instance, its fields unset

    def ok(self, value) -> bool:
        types = [loaded_type(*t.split(":")) if isinstance(t, str) else t for t in self.types]
        return any(t is not None and isinstance(value, t) for t in types)


class OneOf(Kind):
    """What any of ``kinds`` takes (the first that takes it)."""

    def __init__(self, *kinds: Kind, what: str | None = None):
        self.kinds = kinds
        self.what = what or " or ".join(k.what for k in kinds)
        self.sample = kinds[0].sample

    def check(self, value):
        for k in self.kinds:
            try:
                return k.check(value)
            except Refused:
                continue
        self.refuse()


class Source(OneOf):
    """What an analysis reads: a store's path, an open store, or the results of score() (a list)."""

    def __init__(self):
        super().__init__(File(), Instance(list, "attattr_cli.api.results:StoreView", "attattr_cli.store.reader:Store",
                                          what="an open store"),
                         what="a store path, an open store or the results of score()")


class Inputs(Instance):
    """Inputs to score: a text, a (text, text) pair, an Example, or a list of them (each item
    is checked by the function itself, which names the one that is wrong)."""

    def __init__(self):
        super().__init__(str, list, tuple, "attattr_cli.data.types:Example",
                         what="a text, a (text, text) pair, an Example or a list of them")
        self.sample = ["a text"]


class Array(Kind):
    """An array of numbers: a numpy array, a tensor or nested lists (its shape is the
    function's to check)."""

    what, sample = "an array of numbers (a numpy array, a tensor or nested lists)", [[1.0]]

    def check(self, value):
        if hasattr(value, "detach") and hasattr(value, "shape"):  # a tensor (on any device)
            return value
        if not (isinstance(value, (list, tuple)) or hasattr(value, "__array__")):
            self.refuse()
        import numpy as np

        try:
            array = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError, OverflowError):
            self.refuse()
        if array.ndim == 0:
            self.refuse()
        return value


class Progress(Kind):
    what, sample = "True, False or a callable f(done, total, label)", False

    def ok(self, value) -> bool:
        return value is None or isinstance(value, bool) or callable(value)  # None: as False


class Callback(Kind):
    what, sample = "a callable", print

    def ok(self, value) -> bool:
        return callable(value)


_FROM_ANNOTATION = {int: Int, float: Number, bool: Bool, str: Str}


def _from_annotation(annotation, module_globals) -> tuple[Kind | None, bool]:
    """(a kind, whether None is taken) from an annotation: the kind of a plain ``int``,
    ``float``, ``bool`` or ``str``, each optionally ``| None``; None for anything else."""
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(module_globals))  # noqa: S307 (the function's own annotation)
        except Exception:
            return None, False
    args = typing.get_args(annotation)
    plain = [a for a in args if a is not type(None)] if args else [annotation]
    kind = _FROM_ANNOTATION[plain[0]]() if len(plain) == 1 and plain[0] in _FROM_ANNOTATION else None
    return kind, type(None) in args


def declaration(fn) -> dict[str, tuple[Kind | None, bool]]:
    """Every argument of ``fn`` (``self`` and ``**options`` aside) with (its kind, whether
    None is taken); the kind is None for an argument declared nowhere (the tests list those)."""
    fn = getattr(fn, "__checked__", fn)
    kinds = getattr(fn, "__kinds__", {})
    out = {}
    for i, (name, p) in enumerate(inspect.signature(fn).parameters.items()):
        if (i == 0 and name == "self") or p.kind in (p.VAR_KEYWORD, p.VAR_POSITIONAL):
            continue
        kind, none_ok = _from_annotation(p.annotation, fn.__globals__)
        out[name] = (kinds.get(name, kind), none_ok or p.default is None)
    return out


def check_value(kind: Kind, name: str, value):
    """``value`` checked as argument ``name``: its normal form, or the error that names it."""
    try:
        return kind.check(value)
    except Refused as why:
        text = f"must be {why.why}, got {_repr.repr(value)}" + (f" {why.note}" if why.note else "")
        raise refused(kind.error, name, "{name} " + text.replace("{", "{{").replace("}", "}}")) from None


def refused(error, name: str, text: str):
    """An AttattrError of class ``error`` for argument ``name`` whose message is ``text`` with
    ``{name}`` where the argument is named: the CLI renders it with the flag instead."""
    exc = error(text.format(name=name))
    exc.argument, exc.template = name, text
    return exc


def checked(**kinds: Kind):
    """Declare the kinds of ``fn``'s arguments (those its annotation does not say) and check
    every argument given, before the body runs (see the module's docstring)."""

    def wrap(fn):
        fn.__kinds__ = kinds
        sig = inspect.signature(fn)
        known = None

        @functools.wraps(fn)
        def call(*args, **kw):
            nonlocal known
            if known is None:
                known = declaration(fn)
            try:
                bound = sig.bind(*args, **kw)
            except TypeError as exc:
                raise OptionError(f"{fn.__name__}(): {exc}") from None
            for name, value in list(bound.arguments.items()):
                kind, none_ok = known.get(name, (None, True))
                if kind is not None and not (value is None and none_ok):
                    bound.arguments[name] = check_value(kind, name, value)
            with api_names():  # every message in the API's words (see attattr_cli.names)
                return fn(*bound.args, **bound.kwargs)

        call.__checked__ = fn
        return call

    return wrap
