"""The option groups of ``score`` and ``faithfulness``: what belongs together, given together.

``aa.Integration``, ``aa.Target``, ``aa.Compute`` and ``aa.Hooks`` for :func:`~attattr_cli.api.scoring.score`;
``faithfulness`` takes the first three and ``aa.Adversarial``. Each is a small frozen dataclass whose
fields are the old flat keywords (and the CLI's flags), checked when it is made; :func:`regroup` puts
the old keywords, kept for one release, into their groups (docs/api.md, "Scoring"). Imports neither
torch nor transformers."""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, fields, replace
from typing import Any, Callable

from ..engine.options import MAX_NODES
from ..errors import OptionError, warn_user
from .checks import Bool, Callback, Int, Kind, Number, Numbers, OneOf, Str, Threads, Tolerance, check_value


def _checked_fields(obj) -> None:
    """Every field of a group checked against its kind (None where the field's default is
    None), in the normal form the kind gives (a numpy integer as Python's)."""
    for f in fields(obj):
        value = getattr(obj, f.name)
        if value is None and f.default is None:
            continue
        object.__setattr__(obj, f.name, check_value(KINDS[type(obj)][f.name], f.name, value))


def group(cls):
    """An option group: a frozen dataclass whose fields are checked when it is made."""
    cls.__post_init__ = _checked_fields
    return dataclass(frozen=True)(cls)


@group
class Integration:
    """How the path integral is computed (docs/integration.md). Given none of ``steps``,
    ``rule``, ``tol``: error-controlled to tol 0.1 (with ``sources``: the right rule with two
    nodes). ``tol``: adaptive subdivision per example and layer until the estimated error is
    below tol x max |Attr| of the layer, at most ``max_nodes`` nodes; ``rule`` and/or ``steps``:
    that fixed rule instead (``rule="right", steps=20`` is the paper's, ``"left"`` the 2021
    code's)."""

    steps: int | None = None
    rule: str | None = None
    tol: float | None = None
    max_nodes: int = MAX_NODES


@group
class Target:
    """What is attributed. ``target``: the class (predicted, gold, a label name or index); a
    language model's is the predicted next token, ``target_token`` (after ``position``) or the
    joint probability of a ``continuation``. ``output``: prob, logit or logprob of it. ``foil``:
    out(target) - out(foil) instead. ``metric``: for clean / counterfactual pairs, each with its
    own answer and foil (logit-diff, logprob-diff, prob). ``generate=N``: N generated tokens
    (greedy; ``sample=True``: sampled with score's ``seed``), each attributed given everything
    before it; ``per_step=True``: the same for each token of ``continuation``."""

    target: str = "predicted"
    output: str = "prob"
    foil: str | None = None
    target_token: str | None = None
    continuation: str | None = None
    position: int | None = None
    metric: str | None = None
    generate: int | None = None
    per_step: bool = False
    sample: bool = False


@group
class Compute:
    """Where and how the run computes and stores. ``device`` (auto, cpu, cuda, cuda:1, ...),
    ``dtype`` (float32, float64, bfloat16, float16), ``kernel`` (auto, cuda, torch),
    ``store_dtype`` (float32, or float16 to halve the store), ``truncate`` (cut inputs longer
    than the model takes, instead of refusing them). Neither of the rest changes the numbers
    (up to float rounding): ``steps_per_pass`` (integration steps per forward/backward;
    default: fit to memory), ``group`` (short examples of an encoder classifier scored
    together; default 32, up to 64 for narrow models; 1: one at a time), ``memory`` (the peak
    the run may use: bytes, or "4GB"; default: most of the free memory), ``threads`` (torch's;
    default one for short inputs, the free cores for long ones), and under torchrun
    ``keep_shards`` and ``dist_timeout`` (seconds a process waits for the others)."""

    device: str = "auto"
    dtype: str = "float32"
    kernel: str = "auto"
    store_dtype: str = "float32"
    truncate: bool = False
    steps_per_pass: int | None = None
    group: int | None = None
    memory: Any = None
    threads: int | None = None
    keep_shards: bool = False
    dist_timeout: float = 3600.0


@group
class Hooks:
    """What a run calls back: ``warn(message)`` for each warning (default: Python's
    ``warnings``, at the caller's line) and ``notify(line)`` for the estimate said before a
    long run (default: nothing)."""

    warn: Callable | None = None
    notify: Callable | None = None


@group
class Adversarial:
    """faithfulness's adversarial-attention experiment: at output TVD bounds ``epsilons``
    (default 0.01, 0.05) on ``layer`` (default the last). ``adversarial=True`` is
    ``adversarial=aa.Adversarial()``."""

    epsilons: Any = None
    layer: int = -1


# each field's kind: what the old keyword's declaration said (its annotation or @checked)
KINDS: dict[type, dict[str, Kind]] = {
    Integration: {"steps": Int(), "rule": Str(), "tol": Tolerance(), "max_nodes": Int()},
    Target: {"target": Str(), "output": Str(), "foil": Str(), "target_token": Str(), "continuation": Str(),
             "position": Int(), "metric": Str(), "generate": Int(), "per_step": Bool(), "sample": Bool()},
    Compute: {"device": Str(), "dtype": Str(), "kernel": Str(), "store_dtype": Str(), "truncate": Bool(),
              "steps_per_pass": Int(), "group": Int(),
              "memory": OneOf(Number(above=0), Str(), what="a size: bytes, or a string such as 4GB"),
              "threads": Threads(), "keep_shards": Bool(), "dist_timeout": Number(above=0)},
    Hooks: {"warn": Callback(), "notify": Callback()},
    Adversarial: {"epsilons": Numbers(above=0, below=1, single=False), "layer": Int()},
}


class Group(Kind):
    """An argument that takes one group (an instance of ``cls``)."""

    def __init__(self, cls: type):
        self.cls, self.what, self.sample = cls, f"an aa.{cls.__name__}", cls()

    def ok(self, value) -> bool:
        return isinstance(value, self.cls)


def legacy_table(groups: dict[str, type], renamed: dict[str, tuple[str, str]] | None = None,
                 only: dict[str, tuple[str, ...]] | None = None) -> dict[str, tuple[str, str]]:
    """Old flat keyword -> (the argument of its group, the group's field): each field of each
    group under its own name (``only``: just those fields of a group), and ``renamed`` ones."""
    table = {f.name: (arg, f.name) for arg, cls in groups.items() for f in fields(cls)
             if only is None or arg not in only or f.name in only[arg]}
    table.update(renamed or {})
    return table


def _called_from_library() -> bool:
    """Whether the public function was called by attattr itself (its checks' wrapper's caller
    lies in the package): the library's own calls are not the user's to change."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
    checks = os.path.join(package, "api", "checks.py")
    frame = sys._getframe(1)
    while frame is not None and not (frame.f_code.co_name == "call"
                                     and os.path.abspath(frame.f_code.co_filename) == checks):
        frame = frame.f_back
    caller = frame.f_back if frame is not None else None
    return caller is not None and os.path.abspath(caller.f_code.co_filename).startswith(package)


def regroup(function: str, given: dict[str, Any], legacy: dict[str, Any], table: dict[str, tuple[str, str]],
            groups: dict[str, type], shorthand: dict[str, Callable[[Any], Any]] | None = None) -> dict[str, Any]:
    """The groups of a call: ``given`` (argument -> what was passed: a group, None, or a
    ``shorthand`` value such as ``target="gold"``) with the old flat keywords of ``legacy`` put
    in (``table``: keyword -> (argument, field)), each made when missing. An unknown keyword, a
    keyword of the wrong kind, or one given both flat and in a group given is an OptionError;
    the old spelling is said in one FutureWarning naming the new one."""
    unknown = [k for k in legacy if k not in table]
    if unknown:
        raise OptionError(f"{function}(): got an unexpected keyword argument '{unknown[0]}'")
    moved: dict[str, dict[str, Any]] = {}
    for old, value in legacy.items():
        arg, field = table[old]
        cls = groups[arg]
        default = next(f.default for f in fields(cls) if f.name == field)
        if not (value is None and default is None):
            value = check_value(KINDS[cls][field], old, value)  # the old keyword's own message
        if isinstance(given.get(arg), cls):
            raise OptionError(f"{old} is given twice: as {old}= and in {arg}=aa.{cls.__name__}(...); give it once,"
                              f" in {arg}")
        moved.setdefault(arg, {})[field] = value
    out = {}
    for arg, cls in groups.items():
        value = given.get(arg)
        if not isinstance(value, cls):  # not given, or a shorthand (target="gold")
            base = shorthand[arg](value) if value is not None and shorthand and arg in shorthand else cls()
            value = replace(base, **moved[arg]) if arg in moved else base
        out[arg] = value
    if legacy and not _called_from_library():
        spelled = ", ".join(f"{arg}=aa.{groups[arg].__name__}("
                            + ", ".join(f"{field}=..." for field in moved[arg]) + ")" for arg in moved)
        warn_user(f"{function}(): {', '.join(f'{k}=' for k in legacy)} {'is' if len(legacy) == 1 else 'are'} the"
                  f" old spelling, kept for one release; give {spelled}", FutureWarning)
    return out
