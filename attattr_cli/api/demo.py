"""The built-in synthetic task and its model: ``train_default`` (retrain the default model)
and ``synthetic_data`` (write examples of the task). `attattr demo` is these and a print."""

from __future__ import annotations

from pathlib import Path

from ..errors import OptionError
from .checks import Int, Out, Progress, checked
from .model import progress_for


@checked(out=Out(folder=True), progress=Progress())
def train_default(out, *, seed: int = 0, overwrite: bool = False, progress=None) -> dict:
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
            metrics = default.train_default_model(tmp, seed=seed, progress=tick)
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
