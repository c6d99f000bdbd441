"""The one training loop of a sequence classifier (the built-in model's recipe and ``finetune``).

Plain cross-entropy (optionally label-smoothed), AdamW without weight decay on biases and
LayerNorm weights, linear warm-up then linear decay to zero, gradient clipping at 1, batch
order from a generator seeded with ``seed``, each batch right-padded to its longest row.
The caller seeds torch's global generator (model initialisation, dropout) as its recipe needs.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .batching import pad_rows

#: ``on_step(step, total, epoch, loss)`` after every optimisation step
StepFn = Callable[[int, int, int, float], None]


@dataclass
class Trained:
    steps: int
    final_loss: float
    seconds: float
    n_trainable: int  # parameters the optimiser updated


def train_classifier(model: torch.nn.Module, rows: Sequence[dict[str, list[int]]], labels: Sequence[int], *,
                     pad_id: int, epochs: float = 1.0, batch_size: int = 32, lr: float = 1e-4,
                     weight_decay: float = 0.01, warmup: float = 0.0, seed: int = 0,
                     label_smoothing: float = 0.0, on_step: StepFn | None = None) -> Trained:
    """Train ``model`` (left in training mode) on tokenised ``rows`` (``Encoded.model_inputs()``)
    with gold ``labels`` (model output indices) for ``epochs`` passes (a fraction stops part-way
    through the last). ``warmup`` is the fraction of the steps with a linear warm-up (at least
    one step when it is above 0). Only parameters that require grad are trained."""
    model.train()
    labels_t = torch.as_tensor(list(labels), dtype=torch.long)
    n = len(rows)
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name else decay).append(p)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optim = torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                               {"params": no_decay, "weight_decay": 0.0}], lr=lr)
    per_epoch = math.ceil(n / batch_size)
    total = max(1, math.ceil(per_epoch * epochs))
    n_warm = max(1, int(warmup * total)) if warmup > 0 else 0

    def lr_at(step: int) -> float:  # linear warm-up, then linear decay to 0
        if step < n_warm:
            return (step + 1) / n_warm
        return max(0.0, (total - step) / max(1, total - n_warm))

    sched = torch.optim.lr_scheduler.LambdaLR(optim, lr_at)
    gen = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    t0 = time.perf_counter()
    step, epoch, loss_val = 0, 0, float("nan")
    while step < total:
        order = torch.randperm(n, generator=gen).tolist()
        for s in range(0, n, batch_size):
            if step >= total:
                break
            idx = order[s:s + batch_size]
            batch = pad_rows([rows[i] for i in idx], pad_id, device)
            logits = model(**batch).logits
            loss = torch.nn.functional.cross_entropy(logits, labels_t[idx].to(device), label_smoothing=label_smoothing)
            optim.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trainable, 1.0)
            optim.step()
            sched.step()
            step += 1
            loss_val = float(loss.detach())
            if on_step is not None:
                on_step(step, total, epoch, loss_val)
        epoch += 1
    return Trained(steps=total, final_loss=loss_val, seconds=time.perf_counter() - t0,
                   n_trainable=sum(p.numel() for group in (decay, no_decay) for p in group))
