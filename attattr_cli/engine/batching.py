"""Padded batches of tokenised rows and batched classification (evaluation, fine-tuning,
head masking, attacks)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Sequence

import torch


def pad_rows(rows: Sequence[dict[str, list[int]]], pad_id: int, device=None) -> dict[str, torch.Tensor]:
    """One batch from rows of ``{input name: token-level list}`` (the same names in every
    row), right-padded to the longest: ``input_ids`` with ``pad_id``, everything else
    (attention_mask, token_type_ids) with 0."""
    width = max(len(r["input_ids"]) for r in rows)
    batch = {}
    for k in rows[0]:
        fill = pad_id if k == "input_ids" else 0
        batch[k] = torch.tensor([list(r[k]) + [fill] * (width - len(r[k])) for r in rows], dtype=torch.long,
                                device=device)
    return batch


@dataclass
class Batch:
    positions: list[int]  # positions of the rows in the list given to padded_batches
    inputs: dict[str, torch.Tensor]


def pad_id_of(model, tokenizer) -> int | None:
    """The id to pad ``input_ids`` with: the model config's, else the tokenizer's, else None."""
    pad = getattr(model.config, "pad_token_id", None)
    if pad is None:
        pad = getattr(tokenizer, "pad_token_id", None)
    return None if pad is None else int(pad)


def padded_batches(rows: Sequence[dict[str, list[int]]], pad_id: int | None, batch_size: int = 64,
                   device=None) -> list[Batch]:
    """The rows sorted by length (stable) and grouped into right-padded batches of at most
    ``batch_size`` (one row per batch when there is nothing to pad with, ``pad_id`` None)."""
    if pad_id is None:
        batch_size, pad_id = 1, 0
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]["input_ids"]))
    out = []
    for s in range(0, len(order), batch_size):
        chunk = order[s:s + batch_size]
        out.append(Batch(chunk, pad_rows([rows[i] for i in chunk], pad_id, device)))
    return out


def batch_logits(model, batches: Sequence[Batch], n: int,
                 context: Callable[[Batch], ContextManager] | None = None,
                 on_batch: Callable[[int, int, Batch], None] | None = None) -> torch.Tensor:
    """Logits [n, labels] (float32, on the CPU) in the rows' order, each batch run without
    gradients inside ``context(batch)`` when given; ``on_batch(done, total, batch)`` after each."""
    out = None
    with torch.no_grad():
        for i, b in enumerate(batches):
            with (context(b) if context is not None else contextlib.nullcontext()):
                logits = model(**b.inputs).logits
            if out is None:
                out = torch.empty(n, logits.shape[-1], dtype=torch.float32)
            out[b.positions] = logits.float().cpu()
            if on_batch is not None:
                on_batch(i + 1, len(batches), b)
    return out if out is not None else torch.empty(0, 0)


def classify(model, rows: Sequence[dict[str, list[int]]], pad_id: int | None, batch_size: int = 64,
             on_batch: Callable[[int, int, Batch], None] | None = None) -> torch.Tensor:
    """Logits [rows, labels] (float32, CPU, in the rows' order) of a sequence classifier over
    tokenised rows (``Encoded.model_inputs()``), in padded batches of similar length. The model
    runs in eval mode; its training flag is restored afterwards."""
    device = next(model.parameters()).device
    was = model.training
    model.eval()
    try:
        return batch_logits(model, padded_batches(rows, pad_id, batch_size, device), len(rows), on_batch=on_batch)
    finally:
        model.train(was)


def accuracy(predicted: Sequence[int], gold: Sequence[int | None]) -> float:
    """The share of predictions equal to their gold label, over the rows that have one (nan if none)."""
    pairs = [(p, g) for p, g in zip(predicted, gold) if g is not None]
    return sum(int(p == g) for p, g in pairs) / len(pairs) if pairs else float("nan")
