"""Per-architecture facts, kept as data: where the stack of transformer layers lives.

attattr takes over attention through transformers' attention interface, so the only
thing it must know about an architecture is the ModuleList of its layers (to run
layers below the target once and to tell which layer an attention call belongs to).
Known paths are listed here; any other model is searched for the one ModuleList
whose length is the number of hidden layers.

Encoder-decoder models (BART) have several attention *families*: ``encoder`` (encoder
self-attention), ``decoder`` (the decoder's causal self-attention) and ``cross`` (decoder
queries attending to encoder keys). Each is a (layer list, attention submodule) pair,
kept as data in :data:`FAMILY_PATHS`. Every other model has the one family ``self``.
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

# model_type -> families: (name, dotted path of the layer list, attention submodule or None)
# (None: every attention call inside the layer belongs to the family). Paths are tried
# under the task model (``model.``) and under the bare model.
FAMILY_PATHS: dict[str, tuple[tuple[str, str, str | None], ...]] = {
    "bart": (("encoder", "model.encoder.layers", None),
             ("decoder", "model.decoder.layers", "self_attn"),
             ("cross", "model.decoder.layers", "encoder_attn")),
    "mbart": (("encoder", "model.encoder.layers", None),
              ("decoder", "model.decoder.layers", "self_attn"),
              ("cross", "model.decoder.layers", "encoder_attn")),
}
# model_type -> dotted path of the encoder stack of an encoder-decoder model
ENCODER_PATHS: dict[str, str] = {"bart": "model.encoder", "mbart": "model.encoder"}

# the families' meaning, for messages and docs
FAMILY_DOC = {
    "self": "the model's self-attention (encoder-only or decoder-only models)",
    "encoder": "encoder self-attention of an encoder-decoder model",
    "decoder": "decoder causal self-attention of an encoder-decoder model",
    "cross": "cross-attention: decoder queries, encoder keys",
}

# model types whose position embeddings reserve padding_idx + 1 slots
POSITION_OFFSET: dict[str, int] = {"roberta": 2, "xlm-roberta": 2, "camembert": 2}


@dataclass(frozen=True)
class FamilyInfo:
    name: str
    layers_path: str
    attn: str | None  # attention submodule inside each layer (None: the whole layer)
    num_layers: int
    num_heads: int
    query_side: str  # "input" (the input tokens) or "decoder" (the decoder input tokens)
    key_side: str


@dataclass(frozen=True)
class ArchInfo:
    model_type: str
    layers_path: str
    num_layers: int
    num_heads: int
    is_decoder: bool
    max_length: int | None
    families: tuple[FamilyInfo, ...] = ()
    encoder_path: str | None = None  # encoder-decoder models: the encoder stack

    @property
    def family_names(self) -> list[str]:
        return [f.name for f in self.families]

    def family(self, name: str) -> FamilyInfo:
        for f in self.families:
            if f.name == name:
                return f
        raise ModelError(
            f"the model ({self.model_type}) has no attention family '{name}'; it has: " + ", ".join(self.family_names)
        )

    @property
    def is_encoder_decoder(self) -> bool:
        return self.encoder_path is not None


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


def _family_paths(model: torch.nn.Module):
    """The known families of an encoder-decoder model, with paths resolved, or None."""
    spec = FAMILY_PATHS.get(getattr(model.config, "model_type", ""))
    if spec is None:
        return None
    out = []
    for name, path, attn in spec:
        for full in (path, path[len("model."):] if path.startswith("model.") else path):
            try:
                out.append((name, full, attn, _get(model, full)))
                break
            except AttributeError:
                continue
        else:
            raise ModelError(f"cannot find the {name} layers ({path}) of model type '{model.config.model_type}'")
    return out


def find_families(model: torch.nn.Module) -> list[tuple[str, str, str | None, torch.nn.ModuleList]]:
    """[(family, dotted path, attention submodule or None, ModuleList)] of the model."""
    known = _family_paths(model)
    if known is not None:
        return known
    path, layers = find_layers(model)
    return [("self", path, None, layers)]


def find_encoder(model: torch.nn.Module) -> torch.nn.Module | None:
    """The encoder stack of an encoder-decoder model (None for other models)."""
    path = ENCODER_PATHS.get(getattr(model.config, "model_type", ""))
    if path is None:
        return None
    for candidate in (path, path[len("model."):] if path.startswith("model.") else path):
        try:
            return _get(model, candidate)
        except AttributeError:
            continue
    return None


def find_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """Return (dotted path, ModuleList) of the model's transformer layers (for an
    encoder-decoder model: the first family's, the encoder's)."""
    config = model.config
    known = _family_paths(model)
    if known is not None:
        return known[0][1], known[0][3]
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
    families = []
    for name, fpath, attn, flayers in find_families(model):
        if name in ("decoder", "cross"):
            fheads = _config_value(config, "decoder_attention_heads", "num_attention_heads")
        elif name == "encoder":
            fheads = _config_value(config, "encoder_attention_heads", "num_attention_heads")
        else:
            fheads = heads
        families.append(FamilyInfo(name, fpath, attn, len(flayers), int(fheads),
                                   "decoder" if name in ("decoder", "cross") else "input",
                                   "decoder" if name == "decoder" else "input"))
    if heads is None:
        heads = families[0].num_heads
    encoder = ENCODER_PATHS.get(model_type) if find_encoder(model) is not None else None
    return ArchInfo(model_type, path, len(layers), int(heads), is_decoder, max_len, tuple(families), encoder)
