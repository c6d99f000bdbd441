"""Models for the Python API: loading, accepting whatever the caller has, leaving it as it was."""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import ModelError, OptionError
from .checks import File, Kind, Out, Str, checked, is_path, loaded_type


@dataclass
class Model:
    """A model and its tokenizer, ready for every attattr function.

    ``model`` is the transformers module, ``tokenizer`` its tokenizer, ``label_names`` the
    classes in output order, ``config`` the model's config, ``id`` what it was loaded from
    (a folder, a hub id, ``attattr/synthetic-bert`` for the built-in default, or ``memory``).
    attattr never changes it: every call runs it in eval mode without gradients on the
    parameters and restores its training flag, ``requires_grad``, dtype, device, attention
    implementation and forwards afterwards, also after an exception.
    """

    loaded: Any  # models.loading.LoadedModel
    path: str | None = None  # the folder it came from, if any

    @property
    def model(self):
        """The transformers module (``torch.nn.Module``)."""
        return self.loaded.model

    @property
    def tokenizer(self):
        """The model's tokenizer."""
        return self.loaded.tokenizer

    @property
    def label_names(self) -> list[str]:
        """The class names in output order ([] for a language model)."""
        return [] if self.loaded.lm else self.loaded.label_names

    @property
    def config(self):
        """The model's transformers config."""
        return self.loaded.model.config

    @property
    def id(self) -> str:
        """What the model was loaded from (folder, hub id, built-in id or ``memory``)."""
        return self.loaded.model_id

    @property
    def num_layers(self) -> int:
        """Layers of the (first) attention family."""
        return self.loaded.arch.num_layers

    @property
    def num_heads(self) -> int:
        """Heads per layer."""
        return self.loaded.arch.num_heads

    def __repr__(self) -> str:
        return (f"Model({self.id!r}, {type(self.model).__name__}, {self.num_layers} layers x {self.num_heads} heads"
                + (f", labels {self.label_names}" if self.label_names else "") + ")")


class ModelArg(Kind):
    """What :func:`as_model` accepts: a :class:`Model`, a loaded model, a folder, a GGUF file or hub
    id, or a (model, tokenizer) pair."""

    what, sample, error = ("a Model from load_model, a folder, a GGUF file, a hub id or a (model, tokenizer) pair",
                           "model", ModelError)

    def ok(self, value) -> bool:
        loaded = loaded_type("attattr_cli.models.loading", "LoadedModel")
        return (isinstance(value, Model) or (loaded is not None and isinstance(value, loaded)) or is_path(value)
                or (isinstance(value, (tuple, list)) and len(value) == 2))


@checked(source=ModelArg())
def load_model(source=None, *, device: str = "auto", dtype: str = "float32", lm: bool = False) -> Model:
    """Load a model: ``None`` for the built-in default (a small BERT trained on the synthetic
    task), a local folder, a hub id (from the local cache, or the hub when reachable), or an
    already-loaded ``(model, tokenizer)`` pair (used as it is: attattr restores its state after
    every call). ``lm=True`` loads a causal language model. Returns a :class:`Model`.

    >>> model = load_model()
    >>> model.label_names
    ['entailment', 'neutral', 'contradiction']
    """
    return as_model(source, device=device, dtype=dtype, lm=lm)


def as_model(source, *, device: str = "auto", dtype: str = "float32", lm: bool = False) -> Model:
    """Whatever the caller passed as a model, as a :class:`Model` (already one: as it is)."""
    from ..models.loading import LoadedModel

    if isinstance(source, Model):
        return source
    if isinstance(source, LoadedModel):
        return Model(source)
    if source is None:
        from ..models.default import DEFAULT_MODEL_DIR

        source = str(DEFAULT_MODEL_DIR)
    if isinstance(source, (str, Path)):
        from ..models.default import DEFAULT_MODEL_DIR, display_id, is_builtin
        from ..models.loading import load

        loaded = load(str(source), device=device, dtype=dtype, lm=lm)
        path = str(source)
        if is_builtin(path):
            loaded.model_id = display_id(path)
            path = str(DEFAULT_MODEL_DIR)
        return Model(loaded, path if Path(path).exists() else None)
    if isinstance(source, (tuple, list)) and len(source) == 2:
        return Model(_wrap(source[0], source[1], lm))
    raise ModelError(
        f"model must be a Model from load_model, a folder, a hub id or a (model, tokenizer) pair, not {type(source).__name__}"
    )


def _wrap(model, tokenizer, lm: bool):
    """A LoadedModel around a caller's module, without touching it (``prepare`` would switch it
    to eval mode and freeze it: that happens inside :func:`using`, and is undone there)."""
    import torch

    from ..models.arch import arch_info
    from ..models.loading import LoadedModel, weights_hash

    if not isinstance(model, torch.nn.Module):
        raise ModelError(f"model must be a torch module (a transformers model), not {type(model).__name__}")
    if tokenizer is None or not callable(tokenizer):
        raise ModelError("tokenizer must be the model's tokenizer")
    return LoadedModel(model, tokenizer, "memory", "memory", None, weights_hash(model),
                       arch_info(model, tokenizer), lm=lm)


@dataclass
class _State:
    training: dict
    grad: dict
    tensors: dict  # name -> (dtype, device) of parameters and buffers
    attn: list  # (config, _attn_implementation)
    forwards: dict  # module -> instance-level forward (or absent)


def _snapshot(model) -> _State:
    training = {m: m.training for m in model.modules()}
    grad = {p: p.requires_grad for p in model.parameters()}
    tensors = {n: (t.dtype, t.device) for n, t in list(model.named_parameters()) + list(model.named_buffers())}
    configs = []
    for m in model.modules():
        cfg = getattr(m, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and all(cfg is not c for c, _ in configs):
            configs.append((cfg, cfg._attn_implementation))
    forwards = {m: m.__dict__.get("forward", _ABSENT) for m in model.modules()}
    return _State(training, grad, tensors, configs, forwards)


_ABSENT = object()


def _restore(model, s: _State) -> None:
    import torch

    for m, f in s.forwards.items():
        now = m.__dict__.get("forward", _ABSENT)
        if now is not f:
            if f is _ABSENT:
                del m.__dict__["forward"]
            else:
                m.__dict__["forward"] = f
    for cfg, impl in s.attn:
        if cfg._attn_implementation != impl:
            cfg._attn_implementation = impl
    named = dict(model.named_parameters())
    named.update(dict(model.named_buffers()))
    with torch.no_grad():
        for name, (dtype, device) in s.tensors.items():
            t = named.get(name)
            if t is not None and (t.dtype != dtype or t.device != device):
                t.data = t.data.to(device=device, dtype=dtype)
    for p, g in s.grad.items():
        if p.requires_grad != g:
            p.requires_grad_(g)
    for m, tr in s.training.items():
        m.training = tr


@contextlib.contextmanager
def using(model, *, device: str = "auto", dtype: str = "float32", lm: bool = False):
    """The caller's model as a LoadedModel, in eval mode without parameter gradients, inside the
    block; everything attattr may change is put back when the block ends, however it ends."""
    m = as_model(model, device=device, dtype=dtype, lm=lm)
    module = m.loaded.model
    state = _snapshot(module)
    changed = []
    try:
        module.eval()
        for p in module.parameters():
            p.requires_grad_(False)
        if dtype == "float64":  # mixture-of-experts: the grouped experts take no float64
            from ..models.experts import eager_experts

            changed = eager_experts(module)
        yield m
    finally:
        from ..models.experts import restore

        restore(changed)
        _restore(module, state)


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell with a kernel; never imports IPython)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None and hasattr(ipython, "get_ipython") else None
    return shell is not None and getattr(shell, "kernel", None) is not None


class NotebookLine:
    """A progress line in a notebook cell: one text output updated in place through an
    ``IPython.display`` handle (no widgets, so no ipywidgets warning), at most every
    ``every`` seconds; the last update stays as one line (``work 12/12 in 3.1 s``)."""

    WIDTH = 24

    def __init__(self, description: str, every: float = 0.25):
        from IPython.display import display

        self.description, self.every = description, every
        self.start = self.last = time.monotonic()
        self.state = (0, 0, "")
        self.handle = display({"text/plain": f"{description} …"}, raw=True, display_id=True)

    def line(self, done: int, total: int, label: str, final: bool = False) -> str:
        took = time.monotonic() - self.start
        if final:
            return f"{self.description} {done}/{total} in {took:.1f} s" if total else f"{self.description} in {took:.1f} s"
        if not total:
            return f"{self.description} {done} {label}  {took:.1f} s".rstrip()
        full = round(self.WIDTH * min(done / total, 1.0))
        left = f", {took / done * (total - done):.0f} s left" if 0 < done < total else ""
        return f"{self.description} {'█' * full}{'░' * (self.WIDTH - full)} {done}/{total} {label}  {took:.1f} s{left}"

    def __call__(self, done: int, total: int, label: str) -> None:
        self.state = (done, total, label)
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            self.handle.update({"text/plain": self.line(done, total, label)}, raw=True)

    def close(self) -> None:
        self.handle.update({"text/plain": self.line(*self.state, final=True)}, raw=True)


@contextlib.contextmanager
def progress_for(progress, description: str):
    """``progress`` as the library's callback: False/None nothing; True a text line updated in
    place in a Jupyter notebook (:class:`NotebookLine`), a rich bar on stderr when stderr is a
    terminal, nothing otherwise (a script's log, CI); a callable ``f(done, total, label)`` as it is."""
    if progress is None or progress is False:
        yield None
        return
    if callable(progress):
        yield progress
        return
    if progress is not True:
        raise OptionError("progress must be True, False or a callable f(done, total, label)")
    if in_notebook():
        line = NotebookLine(description)
        try:
            yield line
        finally:
            line.close()
        return
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress as Bar, TextColumn, TimeRemainingColumn

    with Bar(TextColumn(description), BarColumn(), MofNCompleteColumn(), TextColumn("{task.description}"),
             TimeRemainingColumn(), console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("", total=None)

        def update(done: int, total: int, label: str) -> None:
            bar.update(task, completed=done, total=total or None, description=label)

        yield update


@checked(source=File(), out=Out(folder=True), dtype=Str(choices=("float32", "float64", "bfloat16", "float16")))
def convert(source, out, *, dtype: str = "float32") -> dict:
    """Write a GGUF file (llama.cpp's format; or the folder holding one) as a plain transformers
    model folder ``out`` (new or empty; docs/models.md, "GGUF files"): every weight dequantized to
    ``dtype``, the tokenizer the file describes, ``config.json``; ``load_model(out, lm=True)`` loads
    it without dequantizing again. Returns {"out", "gguf", "model_type", "parameters",
    "weights_sha256"}. `attattr convert` is this call."""
    from ..models.gguf import convert as write

    return write(source, out, dtype)
