"""Head masking and batched evaluation over the attention interface (no ``head_mask`` in transformers 5).

``masked(model, scale)`` runs the model with each head's output ``A_h V_h`` multiplied by
``scale[layer, head]`` (``[batch, layer, head]`` for one mask per example), for every
architecture attattr routes through its attention function. ``Batches`` encodes examples
once, sorted by length, so that many masks can be evaluated over the same data cheaply.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..data.types import Example
from . import attention, batching
from .encoding import encode

Progress = Callable[[int, int, str], None]


@contextlib.contextmanager
def masked(model: torch.nn.Module, scale: torch.Tensor):
    """Run ``model`` inside the block with heads scaled by ``scale`` ([layer, head] or [batch, layer, head])."""
    with attention.taken_over(model), attention.active(attention.HeadScale(scale)):
        yield


@dataclass
class Batch(batching.Batch):
    gold: torch.Tensor = None  # model output index, -1 where unknown


class Batches:
    """Examples encoded once and grouped into padded batches of similar length.

    ``label_map`` maps a task label index to the model's output index.
    """

    def __init__(self, loaded, examples: Sequence[Example], label_map: Sequence[int] | None = None,
                 batch_size: int = 64, truncate: bool = False):
        self.device = next(loaded.model.parameters()).device
        self.n = len(examples)
        limit = loaded.arch.max_length
        rows = [encode(loaded.tokenizer, e, limit, truncate, tokens=False, token_types=loaded.arch.token_types).model_inputs()
                for e in examples]
        gold = [-1 if e.label is None else (label_map[e.label] if label_map is not None else e.label)
                for e in examples]
        pad = batching.pad_id_of(loaded.model, loaded.tokenizer)
        self.batches: list[Batch] = [
            Batch(b.positions, b.inputs, torch.tensor([gold[i] for i in b.positions], device=self.device))
            for b in batching.padded_batches(rows, pad, batch_size, self.device)
        ]

    def gold(self) -> torch.Tensor:
        out = torch.full((self.n,), -1, dtype=torch.long)
        for b in self.batches:
            out[b.positions] = b.gold.cpu()
        return out


def logits_under(loaded, batches: Batches, scale: torch.Tensor | None,
                 per_example: Callable[[Batch], torch.Tensor] | None = None,
                 progress: Progress | None = None) -> torch.Tensor:
    """Logits [examples, labels] in the order the examples were given, with heads scaled by
    ``scale`` ([layer, head]; None: no masking), or by ``per_example(batch)`` -> [batch, layer, head]."""
    model = loaded.model

    def context(b: Batch):
        s = per_example(b) if per_example is not None else scale
        return attention.taken_over(model) if s is None else masked(model, s)

    return batching.batch_logits(model, batches.batches, batches.n, context,
                                 None if progress is None else lambda done, total, _b: progress(done, total, ""))
