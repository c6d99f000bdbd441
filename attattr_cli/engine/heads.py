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
from ..errors import DataError
from . import attention
from .batching import pad_rows

Progress = Callable[[int, int, str], None]


@contextlib.contextmanager
def masked(model: torch.nn.Module, scale: torch.Tensor):
    """Run ``model`` inside the block with heads scaled by ``scale`` ([layer, head] or [batch, layer, head])."""
    with attention.taken_over(model), attention.active(attention.HeadScale(scale)):
        yield


@dataclass
class Batch:
    positions: list[int]  # positions of the examples in the list given to Batches
    inputs: dict[str, torch.Tensor]
    gold: torch.Tensor  # model output index, -1 where unknown


class Batches:
    """Examples encoded once and grouped into padded batches of similar length.

    ``label_map`` maps a task label index to the model's output index.
    """

    def __init__(self, loaded, examples: Sequence[Example], label_map: Sequence[int] | None = None,
                 batch_size: int = 64, truncate: bool = False):
        tok = loaded.tokenizer
        self.device = next(loaded.model.parameters()).device
        self.n = len(examples)
        limit = loaded.arch.max_length
        rows = []
        for pos, e in enumerate(examples):
            args = (e.text_a,) if e.text_b is None else (e.text_a, e.text_b)
            enc = tok(*args, add_special_tokens=True)
            if limit is not None and len(enc["input_ids"]) > limit:
                if not truncate:
                    raise DataError(f"example {e.index} has {len(enc['input_ids'])} tokens; the model takes at most "
                                    f"{limit} (pass --truncate to cut long inputs)")
                enc = tok(*args, add_special_tokens=True, truncation=True, max_length=limit)
            keys = [k for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc and k in
                    (*tok.model_input_names, "attention_mask")]
            gold = -1 if e.label is None else (label_map[e.label] if label_map is not None else e.label)
            rows.append((pos, {k: list(enc[k]) for k in keys}, gold))
        rows.sort(key=lambda r: len(r[1]["input_ids"]))
        pad = tok.pad_token_id if tok.pad_token_id is not None else 0
        self.batches: list[Batch] = []
        for s in range(0, len(rows), batch_size):
            chunk = rows[s:s + batch_size]
            inputs = pad_rows([r[1] for r in chunk], pad, self.device)
            self.batches.append(Batch([r[0] for r in chunk], inputs,
                                      torch.tensor([r[2] for r in chunk], device=self.device)))

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
    out = None
    with torch.no_grad():
        for i, b in enumerate(batches.batches):
            s = per_example(b) if per_example is not None else scale
            if s is None:
                with attention.taken_over(model):
                    logits = model(**b.inputs).logits
            else:
                with masked(model, s):
                    logits = model(**b.inputs).logits
            if out is None:
                out = torch.empty(batches.n, logits.shape[-1], dtype=torch.float32)
            out[b.positions] = logits.float().cpu()
            if progress:
                progress(i + 1, len(batches.batches), "")
    return out if out is not None else torch.empty(0, 0)
