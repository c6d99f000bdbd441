"""The built-in synthetic task and its model: ``train_default`` (retrain the default model)
and ``synthetic_data`` (write examples of the task). `attattr demo` is these and a print."""

from __future__ import annotations

from pathlib import Path

from ..errors import OptionError
from .checks import Instance, Int, OneOf, Out, Progress, Str, Threads, checked
from .model import ModelArg, progress_for

# a model (what as_model takes) or its tokenizer alone: the pairs need only the tokenizer
ModelOrTokenizer = OneOf(ModelArg(), Instance("transformers.tokenization_utils_base:PreTrainedTokenizerBase",
                                               what="a tokenizer"), what="a model, its folder or hub id, or a tokenizer")


@checked(out=Out(folder=True), progress=Progress(), threads=Threads())
def train_default(out, *, seed: int = 0, overwrite: bool = False, progress=None, threads: int | None = None) -> dict:
    """Retrain the default model (a small BERT on the synthetic task, on CPU) into the folder
    ``out``; returns its metrics (held-out accuracy, seconds, parameters). A non-empty ``out``
    is refused unless ``overwrite`` (as :func:`finetune` does); the model is trained in a
    folder beside it, which replaces ``out`` only once training succeeded."""
    import shutil

    from ..engine.finetune import check_out
    from ..fileio import swap_dir_in, temp_dir_for
    from ..models import default

    check_out(out, overwrite)
    tmp = temp_dir_for(out)
    try:
        with progress_for(progress, "train") as bar:
            tick = None if bar is None else (
                lambda step, total, info: bar(step, total, f"loss {info['loss']:.3f}" if "loss" in info else ""))
            metrics = default.train_default_model(tmp, seed=seed, progress=tick, threads=threads)
        swap_dir_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return metrics


@checked(out=Out(), count=Int(min=1))
def synthetic_data(out, *, count: int = 200, seed: int = 1) -> Path:
    """Write ``count`` synthetic examples (premise, hypothesis, label, planted pair) as TSV to
    ``out``, which must not exist; returns its path."""
    from ..data import synthetic

    out = Path(out)
    if out.exists():
        raise OptionError(f"{out} exists; it was left as it is (choose another file)")
    synthetic.write(out, synthetic.generate(count, seed))
    return out


def pair_tasks(built_in: bool = False) -> tuple[str, ...]:
    """The registered pair tasks (data/pair_tasks/, one module each; plugins' too, unless
    ``built_in``: then no plugin is loaded, as --help needs)."""
    from ..data import pair_tasks as _builtin  # noqa: F401  (the built-in tasks register themselves)
    from ..data.pairs import PAIR_TASKS as registry

    return registry.built_in() if built_in else registry.names()


PAIR_TASKS = pair_tasks(built_in=True)  # for --help (a run accepts every registered one)


def _check_task(task: str) -> None:
    known = pair_tasks()
    if task not in known:
        raise OptionError(f"task must be one of {', '.join(known)}, not {task!r}")


def tokenizer_of(model):
    """The tokenizer of ``model``: a :class:`Model`, a tokenizer itself, or a local folder / hub
    id in the local cache (only its tokenizer files are read, never its weights)."""
    from ..errors import ModelError
    from .model import Model

    if isinstance(model, Model):
        return model.tokenizer
    if callable(model) and hasattr(model, "convert_ids_to_tokens"):
        return model
    if not isinstance(model, (str, Path)):
        raise OptionError(f"model must be a Model, a tokenizer, a folder or a hub id, not {type(model).__name__}")
    from transformers import AutoTokenizer

    path = Path(model).expanduser()
    if path.exists() and not path.is_dir():
        raise ModelError(f"--model {model} is a file; give the model's folder")
    try:
        return AutoTokenizer.from_pretrained(str(path) if path.exists() else str(model),
                                             local_files_only=not path.exists())
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelError(f"cannot load the tokenizer of {model}: {first}") from None


@checked(model=ModelOrTokenizer, count=Int(min=1), seed=Int(), task=Str())
def make_pairs(model, task: str = "ioi", *, count: int = 100, seed: int = 0) -> list:
    """``count`` clean / counterfactual pairs (data/pairs.py ``Pair``) of the built-in ``task``
    (ioi, greater-than, capitals) for ``model``'s tokenizer (a Model, a tokenizer, a folder or
    hub id): every answer and foil one token, prompt and counterfactual of equal token length."""
    from ..data import pair_tasks as registered

    _check_task(task)
    return registered.generate(task, tokenizer_of(model), count, seed)


@checked(out=Out(), model=ModelOrTokenizer, count=Int(min=1), seed=Int(), task=Str())
def pair_data(out, *, task: str = "ioi", model=None, count: int = 100, seed: int = 0) -> Path:
    """Write ``count`` pairs of ``task`` for ``model``'s tokenizer as JSONL (``prompt``,
    ``counterfactual``, ``answer``, ``foil``, and what made them) to ``out``, which must not
    exist; returns its path. `attattr demo data --task ...` is this call."""
    from ..data import pairs

    out = Path(out)
    _check_task(task)
    if model is None:
        raise OptionError(f"the {task} task needs a model (its tokenizer decides which answers are one token)")
    if out.exists():
        raise OptionError(f"{out} exists; it was left as it is (choose another file)")
    made = make_pairs(model, task, count=count, seed=seed)
    pairs.write_pairs(out, made)
    return out
