"""Per-architecture facts, kept as data: where the stack of transformer layers lives.

attattr takes over attention through transformers' attention interface, so the only
thing it must know about an architecture is the ModuleList of its layers (to run
layers below the target once and to tell which layer an attention call belongs to).
Known paths are listed here; any other model is searched for the one ModuleList
whose length is the number of hidden layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import ModelError

# model_type -> dotted path of the layer ModuleList inside the *ForSequenceClassification model
LAYER_PATHS: dict[str, str] = {
    "bert": "bert.encoder.layer",
    "roberta": "roberta.encoder.layer",
    "xlm-roberta": "roberta.encoder.layer",
    "camembert": "roberta.encoder.layer",
    "electra": "electra.encoder.layer",
    "distilbert": "distilbert.transformer.layer",
    "gpt2": "transformer.h",
    "llama": "model.layers",
    "mistral": "model.layers",
    "qwen2": "model.layers",
    "qwen3": "model.layers",
    "gemma": "model.layers",
}

# model types whose position embeddings reserve padding_idx + 1 slots
POSITION_OFFSET: dict[str, int] = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


@dataclass(frozen=True)
class ArchInfo:
    model_type: str
    layers_path: str
    num_layers: int
    num_heads: int
    is_decoder: bool
    max_length: int | None


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _config_value(config, *names):
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return value
    return None


def find_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """Return (dotted path, ModuleList) of the model's transformer layers."""
    config = model.config
    path = LAYER_PATHS.get(getattr(config, "model_type", ""))
    if path is not None:
        try:
            return path, _get(model, path)
        except AttributeError:
            pass
    n_layers = _config_value(config, "num_hidden_layers", "n_layer", "n_layers", "num_layers")
    candidates = [
        (name, mod)
        for name, mod in model.named_modules()
        if isinstance(mod, torch.nn.ModuleList) and len(mod) == n_layers
    ]
    if len(candidates) != 1:
        raise ModelError(
            f"cannot find the transformer layers of model type '{getattr(config, 'model_type', '?')}'"
            f" (found {len(candidates)} candidate layer lists); attattr supports "
            + ", ".join(sorted(LAYER_PATHS))
        )
    return candidates[0]


def arch_info(model: torch.nn.Module, tokenizer=None) -> ArchInfo:
    config = model.config
    path, layers = find_layers(model)
    heads = _config_value(config, "num_attention_heads", "n_head", "n_heads")
    model_type = getattr(config, "model_type", "unknown")
    max_len = _config_value(config, "max_position_embeddings", "n_positions")
    if max_len is not None:
        max_len = int(max_len) - POSITION_OFFSET.get(model_type, 0)
    tok_max = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if tok_max is not None and tok_max < 1_000_000:
        max_len = min(max_len, int(tok_max)) if max_len is not None else int(tok_max)
    is_decoder = bool(getattr(config, "is_decoder", False)) or model_type in {
        "gpt2", "llama", "mistral", "qwen2", "qwen3", "gemma",
    }
    return ArchInfo(model_type, path, len(layers), int(heads), is_decoder, max_len)
