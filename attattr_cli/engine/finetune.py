"""Fine-tuning a sequence classifier (the 2021 code shipped one; users need a model to study).

``finetune`` turns any encoder transformers can load with
``AutoModelForSequenceClassification`` (a bare ``BertModel`` folder such as
all-MiniLM-L6-v2, or a classifier) into a classifier for a task, and saves a
standard model folder (``save_pretrained`` + tokenizer + ``FINETUNE.json`` with
the recipe and the result). The folder is written under a temporary name next to
``out`` and renamed into place, so an interrupted run never leaves a half model.

The library never prints: pass ``progress(done, total, label)`` to follow it.
"""

from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from ..data.types import Example
from ..errors import DataError, ModelError, OptionError, first_line
from ..fileio import swap_dir_in, temp_dir_for, writing
from ..models.loading import check_vocabulary, from_pretrained
from .batching import accuracy, classify, pad_id_of
from .encoding import encode
from .training import train_classifier
from ..fileio import dumps as strict_dumps  # strict JSON: no NaN or Infinity

Progress = Callable[[int, int, str], None]


@dataclass
class FinetuneOptions:
    epochs: float = 1.0
    lr: float = 1e-4
    batch_size: int = 32
    max_length: int = 128
    freeze_embeddings: bool = False
    weight_decay: float = 0.01
    warmup: float = 0.0  # fraction of the steps with linear warm-up; then linear decay to 0
    seed: int = 0
    threads: int = 0  # torch threads during training (0: leave as it is)
    eval_batch_size: int = 128

    def __post_init__(self):
        from .threads import check

        check(self.threads, zero_ok=True)  # before the model loads: 0 .. the machine's CPUs


@dataclass
class FinetuneReport:
    out: str
    train_examples: int
    steps: int
    train_seconds: float
    final_loss: float
    eval_examples: int
    eval_accuracy: float | None
    n_params: int
    n_trainable: int
    label_names: list[str]
    options: dict = field(default_factory=dict)


def load_base(model_id: str, label_names: Sequence[str], seed: int = 0):
    """The model (with a fresh head for ``label_names`` unless it already has them) and its tokenizer."""
    from transformers import AutoConfig, AutoModelForSequenceClassification, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(model_id).expanduser()
    if not path.is_dir() or not (path / "config.json").exists():
        raise ModelError(f"--model {model_id}: not a local model folder with config.json")
    names = [str(n) for n in label_names]
    try:
        cfg = AutoConfig.from_pretrained(str(path))
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"cannot load model folder {model_id}: {first_line(exc)}") from exc
    old = [str(cfg.id2label[i]) for i in range(cfg.num_labels)] if getattr(cfg, "id2label", None) else []
    is_classifier = any(a.endswith("ForSequenceClassification") for a in (cfg.architectures or []))
    same_head = is_classifier and [n.lower() for n in old] == [n.lower() for n in names]
    torch.manual_seed(seed)  # the new head's initialisation
    kwargs = {} if same_head else dict(
        num_labels=len(names), id2label=dict(enumerate(names)), label2id={n: i for i, n in enumerate(names)},
        ignore_mismatched_sizes=True,
    )
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the "newly initialised head" load report: expected here
    try:
        model = from_pretrained(AutoModelForSequenceClassification, str(path), model_id, dtype=torch.float32,
                                **kwargs)
        check_vocabulary(model, tokenizer, model_id)
    except (OSError, ValueError, KeyError) as exc:
        raise ModelError(f"'{model_id}' cannot become a sequence classifier: {first_line(exc)}") from exc
    finally:
        hf_logging.set_verbosity(level)
    return model, tokenizer


def _encode(tokenizer, examples: Sequence[Example], max_length: int) -> list[dict]:
    return [encode(tokenizer, e, max_length, truncate=True, tokens=False).model_inputs() for e in examples]


def evaluate(model, tokenizer, examples: Sequence[Example], max_length: int = 128, batch_size: int = 128,
             progress: Progress | None = None) -> tuple[float, list[int]]:
    """Accuracy over the examples with a gold label, and the predicted index of every example."""
    rows = _encode(tokenizer, examples, max_length)
    logits = classify(model, rows, pad_id_of(model, tokenizer), batch_size,
                      None if progress is None else
                      lambda done, total, _b: progress(min(done * batch_size, len(rows)), len(rows), "eval"))
    preds = logits.argmax(-1).tolist() if rows else []
    return accuracy(preds, [e.label for e in examples]), preds


def _atomic_save(model, tokenizer, out: Path, overwrite: bool, extra: dict) -> None:
    out = Path(out)
    check_out(out, overwrite)
    tmp = temp_dir_for(out)
    try:
        with writing(out):  # a full disk or ulimit -f in safetensors: the one line
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
        (tmp / "FINETUNE.json").write_text(strict_dumps(extra, indent=2) + "\n", encoding="utf-8")
        swap_dir_in(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def check_out(out: str | Path, overwrite: bool) -> None:
    """Refuse before training when the result could not be written."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise OptionError(f"--out {out} is a file; give a folder to write the model to")
    if out.exists() and any(out.iterdir()) and not overwrite:
        raise OptionError(f"--out {out} exists and is not empty; it was left as it is (pass --overwrite or choose another)")


def finetune(
    model_id: str,
    train: Sequence[Example],
    label_names: Sequence[str],
    out: str | Path,
    options: FinetuneOptions | None = None,
    eval_examples: Sequence[Example] | None = None,
    progress: Progress | None = None,
    overwrite: bool = False,
    provenance: dict | None = None,
) -> FinetuneReport:
    """Fine-tune ``model_id`` on ``train`` (labels index ``label_names``) and save it to ``out``.

    Trained by engine/training.py's loop (batch order seeded by ``options.seed``); evaluated on
    ``eval_examples`` (their labels must index the same names) after training.
    """
    opt = options or FinetuneOptions()
    if opt.epochs <= 0 or opt.batch_size < 1 or opt.lr <= 0 or opt.max_length < 2:
        raise OptionError("--epochs, --lr must be > 0, --batch-size >= 1 and --max-length >= 2")
    train = [e for e in train if e.label is not None]
    if not train:
        raise DataError("no training example has a gold label")
    bad = [e for e in train if not 0 <= e.label < len(label_names)]
    if bad:
        raise DataError(f"example {bad[0].index}: label {bad[0].label} outside 0..{len(label_names) - 1}")
    check_out(out, overwrite)
    old_threads = torch.get_num_threads()
    if opt.threads > 0:
        torch.set_num_threads(opt.threads)
    try:
        model, tokenizer = load_base(model_id, label_names, opt.seed)
        model.train()
        if opt.freeze_embeddings:
            emb = model.get_input_embeddings()
            base = getattr(model, getattr(model, "base_model_prefix", ""), None)
            module = getattr(base, "embeddings", None) if base is not None else None
            for p in (module or emb).parameters():
                p.requires_grad_(False)
        rows = _encode(tokenizer, train, opt.max_length)
        n = len(rows)
        torch.manual_seed(opt.seed)  # dropout
        smooth = None

        def on_step(step: int, total: int, _epoch: int, loss: float) -> None:
            nonlocal smooth
            smooth = loss if smooth is None else 0.95 * smooth + 0.05 * loss
            if progress:
                progress(step, total, f"loss {smooth:.3f}")

        trained = train_classifier(model, rows, [e.label for e in train], pad_id=tokenizer.pad_token_id or 0,
                                   epochs=opt.epochs, batch_size=opt.batch_size, lr=opt.lr,
                                   weight_decay=opt.weight_decay, warmup=opt.warmup, seed=opt.seed, on_step=on_step)
        model.eval()
        acc, n_eval = None, 0
        if eval_examples:
            acc, _ = evaluate(model, tokenizer, eval_examples, opt.max_length, opt.eval_batch_size, progress)
            n_eval = sum(1 for e in eval_examples if e.label is not None)
        for p in model.parameters():
            p.requires_grad_(True)
        report = FinetuneReport(
            out=str(out), train_examples=n, steps=trained.steps, train_seconds=trained.seconds,
            final_loss=trained.final_loss, eval_examples=n_eval, eval_accuracy=acc,
            n_params=sum(p.numel() for p in model.parameters()), n_trainable=trained.n_trainable,
            label_names=[str(x) for x in label_names], options=asdict(opt),
        )
        extra = {"base_model": str(model_id), **asdict(report), **(provenance or {})}
        _atomic_save(model, tokenizer, Path(out), overwrite, extra)
    finally:
        torch.set_num_threads(old_threads)
    return report
