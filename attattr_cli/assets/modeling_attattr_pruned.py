"""Sequence classifiers with attention heads removed, written by ``attattr prune --save-model``.

transformers 5 has neither ``prune_heads`` nor ``config.pruned_heads``, and its BERT-family
layers take the number of heads from the projection sizes (``view(..., -1, head_size)``).
This file is copied into the saved model folder next to ``config.json``, whose ``auto_map``
points here and whose ``attattr_kept_heads`` lists, per layer, the original indices of the
heads kept. Load the folder with plain transformers::

    AutoModelForSequenceClassification.from_pretrained(folder, trust_remote_code=True)

The model is built with the sliced Q/K/V and output-projection shapes, so the safetensors
load as they are. A layer that keeps no head has no attention parameters left: its
attention block adds only the output projection's bias before the LayerNorm, which is
what masking every head of that layer computes.

Self-contained on purpose (it imports only torch and transformers).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from transformers import BertForSequenceClassification, ElectraForSequenceClassification, RobertaForSequenceClassification


class NoHeads(nn.Module):
    """A self-attention with no heads left: a zero-width context and no weights."""

    def __init__(self, head_size: int):
        super().__init__()
        self.attention_head_size = head_size
        self.num_attention_heads = 0
        self.all_head_size = 0

    def forward(self, hidden_states, *args, **kwargs):
        return hidden_states.new_zeros(*hidden_states.shape[:-1], 0), None


def _rows(linear: nn.Linear, index: torch.Tensor) -> nn.Linear:
    new = nn.Linear(linear.in_features, len(index), bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias[index])
    return new


def _columns(linear: nn.Linear, index: torch.Tensor) -> nn.Linear:
    with warnings.catch_warnings():  # zero columns (no head left): torch warns that init is a no-op
        warnings.simplefilter("ignore", UserWarning)
        new = nn.Linear(len(index), linear.out_features, bias=linear.bias is not None,
                        device=linear.weight.device, dtype=linear.weight.dtype)
    with torch.no_grad():
        new.weight.copy_(linear.weight[:, index])
        if linear.bias is not None:
            new.bias.copy_(linear.bias)
    return new


def slice_attention(attention: nn.Module, kept: list[int]) -> None:
    """Keep heads ``kept`` (original indices) of one BERT-family attention block, in place."""
    sa = attention.self
    d = sa.attention_head_size
    if not kept:
        attention.self = NoHeads(d)
        attention.output.dense = _columns(attention.output.dense, torch.zeros(0, dtype=torch.long))
        return
    index = torch.cat([torch.arange(h * d, (h + 1) * d) for h in kept]).to(sa.query.weight.device)
    sa.query, sa.key, sa.value = _rows(sa.query, index), _rows(sa.key, index), _rows(sa.value, index)
    sa.num_attention_heads = len(kept)
    sa.all_head_size = len(kept) * d
    attention.output.dense = _columns(attention.output.dense, index)


def prune_model(model: nn.Module, kept_heads: list[list[int]]) -> None:
    """Slice every layer of a BERT/RoBERTa/ELECTRA classifier to its kept heads, in place."""
    base = getattr(model, model.base_model_prefix)
    layers = base.encoder.layer
    if len(kept_heads) != len(layers):
        raise ValueError(f"attattr_kept_heads lists {len(kept_heads)} layers, the model has {len(layers)}")
    for layer, kept in zip(layers, kept_heads):
        slice_attention(layer.attention, [int(h) for h in kept])


class AttattrPrunedBertForSequenceClassification(BertForSequenceClassification):
    def __init__(self, config):
        super().__init__(config)
        prune_model(self, config.attattr_kept_heads)


class AttattrPrunedRobertaForSequenceClassification(RobertaForSequenceClassification):
    def __init__(self, config):
        super().__init__(config)
        prune_model(self, config.attattr_kept_heads)


class AttattrPrunedElectraForSequenceClassification(ElectraForSequenceClassification):
    def __init__(self, config):
        super().__init__(config)
        prune_model(self, config.attattr_kept_heads)


CLASSES = {
    "bert": AttattrPrunedBertForSequenceClassification,
    "roberta": AttattrPrunedRobertaForSequenceClassification,
    "electra": AttattrPrunedElectraForSequenceClassification,
}
