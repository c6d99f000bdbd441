"""The built-in default model: a tiny BERT trained on the synthetic pair task.

The trained folder is committed at :data:`DEFAULT_MODEL_DIR` (a standard
``save_pretrained`` folder: ``config.json``, ``model.safetensors`` and the
tokenizer files), so the tool has a model and data to run on with no download.
:func:`train_default_model` is the recipe that produced it (see ``TRAINING.md``
in that folder).  It loads with plain transformers::

    AutoModelForSequenceClassification.from_pretrained(DEFAULT_MODEL_DIR)
    AutoTokenizer.from_pretrained(DEFAULT_MODEL_DIR)

The library never prints: pass ``progress`` to follow training.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path
from typing import Any, Callable

from attattr_cli.data import synthetic

DEFAULT_MODEL_DIR: Path = Path(__file__).resolve().parent.parent / "assets" / "default_model"
DEFAULT_MODEL_ID = "attattr/synthetic-nli-bert"

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
MAX_LENGTH = 64

#: The architecture of the default model.
MODEL_SHAPE = dict(
    num_hidden_layers=3,
    num_attention_heads=4,
    hidden_size=64,
    intermediate_size=128,
    max_position_embeddings=MAX_LENGTH,
    type_vocab_size=2,
)

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


def build_config(
    vocab_size: int, dropout: float = 0.0, attention_dropout: float | None = None, init_range: float = 0.1
):
    """The tiny BERT of :data:`MODEL_SHAPE` with the task's three labels.

    ``initializer_range`` is 0.1 instead of BERT's 0.02: the task gives no signal
    from either key word alone, and the larger random init shortens the initial
    loss plateau of a from-scratch model.
    """
    from transformers import BertConfig

    return BertConfig(
        vocab_size=vocab_size,
        initializer_range=init_range,
        hidden_dropout_prob=dropout,
        attention_probs_dropout_prob=dropout if attention_dropout is None else attention_dropout,
        id2label=dict(enumerate(synthetic.LABELS)),
        label2id={name: i for i, name in enumerate(synthetic.LABELS)},
        pad_token_id=0,
        **MODEL_SHAPE,
    )


def _encode(tokenizer, examples):
    enc = tokenizer(
        [ex.text_a for ex in examples],
        [ex.text_b for ex in examples],
        padding="longest",
        truncation=True,
        max_length=MAX_LENGTH,
        return_tensors="pt",
    )
    return enc


def evaluate(model, tokenizer, examples, batch_size: int = 256) -> float:
    """Accuracy of ``model`` on ``examples`` (labels as indices)."""
    import torch

    was_training = model.training
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(examples), batch_size):
            chunk = examples[s : s + batch_size]
            enc = _encode(tokenizer, chunk)
            pred = model(**enc).logits.argmax(-1)
            gold = torch.tensor([ex.label for ex in chunk])
            correct += int((pred == gold).sum())
    model.train(was_training)
    return correct / max(len(examples), 1)


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

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    old_threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        t0 = time.perf_counter()
        random.seed(seed)
        torch.manual_seed(seed)

        vocab_file = build_vocab_file(out_dir / "vocab.txt")
        tokenizer = build_tokenizer(vocab_file)
        config = build_config(
            len(tokenizer.get_vocab()), dropout=dropout, attention_dropout=attention_dropout, init_range=init_range
        )
        model = BertForSequenceClassification(config)
        model.train()

        train = synthetic.train_set(train_size)
        enc = _encode(tokenizer, train)  # one padding for all: the texts are short
        labels = torch.tensor([ex.label for ex in train])
        n = len(train)

        decay, no_decay = [], []
        for name, p in model.named_parameters():
            (no_decay if p.ndim < 2 or "LayerNorm" in name else decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=lr,
        )
        steps_per_epoch = math.ceil(n / batch_size)
        total = steps_per_epoch * epochs
        n_warm = max(1, int(warmup * total))

        def lr_at(step: int) -> float:  # linear warmup, then linear decay to 0
            if step < n_warm:
                return (step + 1) / n_warm
            return max(0.0, (total - step) / max(1, total - n_warm))

        sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
        gen = torch.Generator().manual_seed(seed)
        step = 0
        loss_val = float("nan")
        for epoch in range(epochs):
            order = torch.randperm(n, generator=gen)
            for s in range(0, n, batch_size):
                idx = order[s : s + batch_size]
                batch = {k: v[idx] for k, v in enc.items()}
                # trim the common padding of this batch
                width = int(batch["attention_mask"].sum(1).max())
                batch = {k: v[:, :width] for k, v in batch.items()}
                logits = model(**batch).logits
                loss = torch.nn.functional.cross_entropy(logits, labels[idx], label_smoothing=label_smoothing)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                sched.step()
                step += 1
                loss_val = float(loss.detach())
                if progress is not None:
                    progress(step, total, {"epoch": epoch, "loss": loss_val})
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

    return {
        "heldout_accuracy": acc,
        "train_seconds": train_seconds,
        "n_params": sum(p.numel() for p in model.parameters()),
        "train_size": train_size,
        "epochs": epochs,
        "steps": total,
        "seed": seed,
        "final_loss": loss_val,
    }
