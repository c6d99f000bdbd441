"""The built-in default model: a tiny BERT trained on the synthetic pair task.

The trained folder is committed at :data:`DEFAULT_MODEL_DIR` (a standard ``save_pretrained``
folder: ``config.json``, ``model.safetensors``, the tokenizer files; plain transformers loads it),
so the tool has a model and data to run on with no download. :func:`train_default_model` is the
recipe that produced it (``TRAINING.md`` in that folder). The library never prints: pass
``progress`` to follow training.
"""

from __future__ import annotations

import random
import time
from pathlib import Path
from typing import Any, Callable

from attattr_cli.data import synthetic

DEFAULT_MODEL_DIR: Path = Path(__file__).resolve().parent.parent / "assets" / "default_model"
DEFAULT_MODEL_ID = "attattr/synthetic-nli-bert"

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_LENGTH = 64
TRAIN_THREADS = 2  # torch threads while training the default model (threads= gives another count)

#: The architecture of the default model.
MODEL_SHAPE = dict(num_hidden_layers=3, num_attention_heads=4, hidden_size=64, intermediate_size=128,
                   max_position_embeddings=MAX_LENGTH, type_vocab_size=2)

ProgressFn = Callable[[int, int, dict], None]


def build_vocab_file(path: str | Path) -> Path:
    """Write the WordPiece vocab (special tokens, then every task word), one per line."""
    path = Path(path)
    path.write_text("\n".join([*SPECIAL_TOKENS, *synthetic.vocabulary()]) + "\n", encoding="utf-8")
    return path


def build_tokenizer(vocab_file: str | Path):
    """A lower-casing BERT WordPiece tokenizer over the task vocabulary."""
    from transformers import BertTokenizerFast

    tokens = Path(vocab_file).read_text(encoding="utf-8").splitlines()
    vocab = {tok: i for i, tok in enumerate(tokens)}
    return BertTokenizerFast(vocab=vocab, do_lower_case=True, model_max_length=MAX_LENGTH)


def build_config(vocab_size: int, dropout: float = 0.0, attention_dropout: float | None = None,
                 init_range: float = 0.1):
    """The tiny BERT of :data:`MODEL_SHAPE` with the task's three labels.

    ``initializer_range`` is 0.1 instead of BERT's 0.02: the task gives no signal
    from either key word alone, and the larger random init shortens the initial
    loss plateau of a from-scratch model.
    """
    from transformers import BertConfig

    return BertConfig(vocab_size=vocab_size, initializer_range=init_range, hidden_dropout_prob=dropout,
                      attention_probs_dropout_prob=dropout if attention_dropout is None else attention_dropout,
                      id2label=dict(enumerate(synthetic.LABELS)),
                      label2id={name: i for i, name in enumerate(synthetic.LABELS)}, pad_token_id=0, **MODEL_SHAPE)


def _encode(tokenizer, examples) -> list[dict]:
    from ..engine.encoding import encode

    return [encode(tokenizer, ex, MAX_LENGTH, truncate=True, tokens=False).model_inputs() for ex in examples]


def evaluate(model, tokenizer, examples, batch_size: int = 256) -> float:
    """Accuracy of ``model`` on ``examples`` (labels as indices)."""
    from ..engine.batching import accuracy, classify

    logits = classify(model, _encode(tokenizer, examples), tokenizer.pad_token_id or 0, batch_size)
    return accuracy(logits.argmax(-1).tolist(), [ex.label for ex in examples]) if len(examples) else 0.0


def is_builtin(model_path: str | Path) -> bool:
    """Whether ``model_path`` is the folder of the built-in model."""
    try:
        return Path(model_path).resolve() == DEFAULT_MODEL_DIR.resolve()
    except (OSError, TypeError, ValueError):
        return False


def display_id(model_path: str | Path) -> str:
    """The name a model is recorded and shown under: :data:`DEFAULT_MODEL_ID` for the
    built-in model's folder (wherever the package is installed), else ``model_path`` as given."""
    return DEFAULT_MODEL_ID if is_builtin(model_path) else str(model_path)


def train_default_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    train_size: int = 6000,
    epochs: int = 8,
    batch_size: int = 32,
    lr: float = 1e-3,
    warmup: float = 0.06,
    weight_decay: float = 0.01,
    dropout: float = 0.0,
    attention_dropout: float | None = 0.1,
    label_smoothing: float = 0.0,
    init_range: float = 0.1,
    progress: ProgressFn | None = None,
    threads: int | None = None,
) -> dict[str, Any]:
    """Train the default model on CPU and save it with ``save_pretrained`` into ``out_dir``.

    Deterministic given ``seed`` (model init and batch order; the training data is
    always ``synthetic.train_set(train_size)``).  ``progress(step, total, info)`` is
    called after every optimisation step with ``info = {"epoch", "loss"}`` and once
    more at the end with ``info = {"heldout_accuracy"}``.

    Returns ``{"heldout_accuracy", "train_seconds", "n_params", "train_size",
    "epochs", "steps", "seed", "final_loss"}``.
    """
    import torch
    from transformers import BertForSequenceClassification
    from transformers.utils import logging as hf_logging

    from ..engine.training import train_classifier

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(threads or TRAIN_THREADS)
    try:
        t0 = time.perf_counter()
        random.seed(seed)
        torch.manual_seed(seed)

        vocab_file = build_vocab_file(out_dir / "vocab.txt")
        tokenizer = build_tokenizer(vocab_file)
        config = build_config(len(tokenizer.get_vocab()), dropout=dropout, attention_dropout=attention_dropout,
                              init_range=init_range)
        model = BertForSequenceClassification(config)
        model.train()

        train = synthetic.train_set(train_size)
        rows = _encode(tokenizer, train)

        def on_step(step: int, total: int, epoch: int, loss: float) -> None:
            if progress is not None:
                progress(step, total, {"epoch": epoch, "loss": loss})

        trained = train_classifier(model, rows, [ex.label for ex in train], pad_id=tokenizer.pad_token_id or 0,
                                   epochs=epochs, batch_size=batch_size, lr=lr, weight_decay=weight_decay,
                                   warmup=warmup, seed=seed, label_smoothing=label_smoothing, on_step=on_step)
        total, loss_val = trained.steps, trained.final_loss
        train_seconds = time.perf_counter() - t0

        model.eval()
        acc = evaluate(model, tokenizer, synthetic.heldout())
        if progress is not None:
            progress(total, total, {"heldout_accuracy": acc})

        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # save_pretrained draws a tqdm bar; we never print
        try:
            model.save_pretrained(out_dir)
            tokenizer.save_pretrained(out_dir)
        finally:
            if bars:
                hf_logging.enable_progress_bar()
        if not (out_dir / "vocab.txt").exists():
            build_vocab_file(out_dir / "vocab.txt")
    finally:
        torch.set_num_threads(old_threads)

    return {"heldout_accuracy": acc, "train_seconds": train_seconds,
            "n_params": sum(p.numel() for p in model.parameters()), "train_size": train_size, "epochs": epochs,
            "steps": total, "seed": seed, "final_loss": loss_val}
