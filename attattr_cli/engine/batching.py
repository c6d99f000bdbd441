"""Right-padding tokenised rows into one batch (evaluation, fine-tuning, attacks)."""

from __future__ import annotations

from typing import Sequence

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
