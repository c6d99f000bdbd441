"""Per-architecture facts, kept as data: where the stack of transformer layers lives
(docs/models.md, "What attattr needs to know about an architecture").

What attattr must know about an architecture is the ModuleList of its layers (to run the layers
below the target once and to tell which layer an attention call belongs to): a known path, or
the one ModuleList as long as the number of hidden layers (an adapter may give the list itself:
ALBERT's shared layer, XLNet). Encoder-decoder models have several attention *families*,
``encoder``, ``decoder`` (causal self-attention) and ``cross`` (decoder queries, encoder keys),
each a (layer list, attention submodule) pair in :data:`FAMILY_PATHS`; every other model has the
one family ``self``.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

import torch

from ..errors import ModelError, OptionError
from . import adapters

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
_BART = (("encoder", "model.encoder.layers", None),
         ("decoder", "model.decoder.layers", "self_attn"),
         ("cross", "model.decoder.layers", "encoder_attn"))
# T5 blocks: layer.0 self-attention, layer.1 cross-attention (decoder), then the feed-forward;
# the relative position bias is computed by each stack's first block and handed on
_T5 = (("encoder", "transformer.encoder.block", None),
       ("decoder", "transformer.decoder.block", "layer.0"),
       ("cross", "transformer.decoder.block", "layer.1"))
# T5Gemma: Gemma layers as an encoder and a decoder (self_attn, cross_attn)
_T5GEMMA = (("encoder", "model.encoder.layers", None),
            ("decoder", "model.decoder.layers", "self_attn"),
            ("cross", "model.decoder.layers", "cross_attn"))
FAMILY_PATHS: dict[str, tuple[tuple[str, str, str | None], ...]] = {
    "t5gemma": _T5GEMMA, **dict.fromkeys(("bart", "mbart", "plbart", "mvp", "bigbird_pegasus"), _BART),
    **dict.fromkeys(("t5", "mt5", "umt5"), _T5)}
# model_type -> dotted path of the encoder stack of an encoder-decoder model (its encoder layers' parent)
ENCODER_PATHS: dict[str, str] = {t: spec[0][1].rsplit(".", 1)[0] for t, spec in FAMILY_PATHS.items()}

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
    # layer -> what it is, for the layers of a hybrid model that compute no softmax attention
    # (a Mamba, linear-attention, convolution or recurrent layer): not scored
    not_attention: tuple[tuple[int, str], ...] = ()

    @property
    def attention_layers(self) -> list[int]:
        """The layers whose attention attattr scores (every layer but the not-attention ones)."""
        skip = dict(self.not_attention)
        return [i for i in range(self.num_layers) if i not in skip]

    def scored(self, layers: list[int]) -> list[int]:
        """``layers`` without the not-attention ones; OptionError when only such layers are asked for."""
        skip = dict(self.not_attention)
        out = [i for i in layers if i not in skip]
        if layers and not out:
            raise OptionError(f"{self.name} layer{'s' if len(layers) > 1 else ''} "
                             + ", ".join(f"{i} ({skip[i]})" for i in layers)
                             + " compute no softmax attention; the attention layers are "
                             + ", ".join(map(str, self.attention_layers)))
        return out


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
    token_types: int | None = None  # the config's type_vocab_size (1: a pair's second segment is type 0 too)

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

    @property
    def hybrid_note(self) -> str | None:
        """The one notice for a hybrid model (some layers compute no softmax attention), or None."""
        parts = [f for f in self.families if f.not_attention]
        if not parts:
            return None
        f = parts[0]
        kinds = sorted({kind for _, kind in f.not_attention})
        return (f"model type '{self.model_type}' is a hybrid: {len(f.not_attention)} of its {f.num_layers} layers"
                f" compute no softmax attention ({', '.join(kinds)}: layers "
                f"{_ranges([i for i, _ in f.not_attention])}) and are not scored; attention layers "
                f"{_ranges(f.attention_layers)} are")


def _ranges(xs: list[int]) -> str:
    """[0, 1, 2, 5] -> '0-2, 5'."""
    out, start = [], None
    for k, x in enumerate(xs):
        if start is None:
            start = x
        if k + 1 == len(xs) or xs[k + 1] != x + 1:
            out.append(str(start) if start == x else f"{start}-{x}")
            start = None
    return ", ".join(out)


def _get(obj, dotted: str):
    for part in dotted.split("."):
        obj = getattr(obj, part)
    return obj


def _config_value(config, *names):
    for name in names:
        try:
            value = getattr(config, name, None)
        except NotImplementedError:  # XLNet: "no sequence length limit"
            value = None
        if value is not None:
            return value
    return None


def _resolve(model: torch.nn.Module, path: str) -> tuple[str, torch.nn.Module] | None:
    """(path, module) at ``path`` under the task model or, without its first part, under the bare
    model (``model.encoder.layers`` -> ``encoder.layers``); None where neither is there."""
    for candidate in (path, path.split(".", 1)[1]) if "." in path else (path,):
        try:
            return candidate, _get(model, candidate)
        except AttributeError:
            continue
    return None


def _family_paths(model: torch.nn.Module):
    """The known families of an encoder-decoder model, with paths resolved, or None."""
    spec = FAMILY_PATHS.get(getattr(model.config, "model_type", ""))
    if spec is None:
        return None
    out = []
    for name, path, attn in spec:
        found = _resolve(model, path)
        if found is None:
            raise ModelError(f"cannot find the {name} layers ({path}) of model type '{model.config.model_type}'")
        out.append((name, found[0], attn, found[1]))
    return out


def takes_logits_to_keep(model: torch.nn.Module) -> bool:
    """Whether the model's forward can run only the needed positions through its LM head
    (``logits_to_keep``; docs/models.md, "Decoder LLMs as language models")."""
    return "logits_to_keep" in inspect.signature(model.forward).parameters


def last_logits_only(length: int, device=None) -> dict:
    """Forward keywords that send only the last of ``length`` positions through the LM head of a
    model that :func:`takes_logits_to_keep` (checked once by the caller, not per pass). The
    position is an index tensor, not ``1``: ``1`` slices the hidden states without a copy, and
    non-contiguous rows take a slow path in PyTorch's CPU linear, where indexing copies them."""
    return {"logits_to_keep": torch.tensor([length - 1], device=device)}


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
    found = _resolve(model, path) if path is not None else None
    return found[1] if found is not None else None


def find_layers(model: torch.nn.Module) -> tuple[str, torch.nn.ModuleList]:
    """Return (dotted path, ModuleList) of the model's transformer layers (for an
    encoder-decoder model: the first family's, the encoder's)."""
    config = model.config
    known = _family_paths(model)
    if known is not None:
        return known[0][1], known[0][3]
    adapter = adapters.adapter_for(model)
    shared = adapter.layer_list(model) if adapter is not None else None
    if shared is not None:
        return shared
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
            f" (found {len(candidates)} candidate layer lists); see docs/models.md for the supported architectures"
        )
    return candidates[0]


def attention_module(layer: torch.nn.Module, attn: str | None) -> torch.nn.Module:
    """The attention submodule ``attn`` (dotted) of a layer; the layer itself for None."""
    return layer if attn is None else _get(layer, attn)


def _causal(model: torch.nn.Module) -> bool:
    """Whether the model's self-attention is causal, from the model itself: the config's
    ``is_decoder``, an attention module that declares itself causal (``is_causal``), or an
    adapter whose architecture applies a causal mask in its own code."""
    if getattr(model.config, "is_decoder", False):
        return True
    adapter = adapters.adapter_for(model)
    if adapter is not None and adapter.causal is not None:
        return adapter.causal
    return any(getattr(m, "is_causal", False) is True for m in model.modules())


def _has_attention(model: torch.nn.Module) -> bool:
    """Whether any module of the model is an attention module (by its class name)."""
    return any("attention" in type(m).__name__.lower() or "attn" in type(m).__name__.lower()
               for m in model.modules())


# what, in a module's class, calls transformers' attention interface
_INTERFACE = ("ALL_ATTENTION_FUNCTIONS", "eager_attention_forward", "attention_interface")
# kinds of layers without softmax attention, by a piece of their modules' class names
_LAYER_KINDS = (("mamba", "Mamba"), ("ssm", "state-space"), ("mixer", "Mamba"), ("linearattention", "linear attention"),
                ("gateddeltanet", "linear attention"), ("deltanet", "linear attention"), ("lightning", "linear attention"),
                ("shortconv", "convolution"), ("conv", "convolution"), ("recurrent", "recurrent"), ("rglru", "recurrent"),
                ("rwkv", "recurrent"), ("lstm", "recurrent"), ("linear_attn", "linear attention"))


@functools.cache
def _calls_interface(cls: type) -> bool:
    """Whether a module class computes attention through transformers' attention interface
    (read from its source: the interface's names)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):
        return False
    return any(name in source for name in _INTERFACE)


def _layer_kind(layer: torch.nn.Module) -> str:
    """What a layer without softmax attention computes instead, from its modules' class names."""
    names = [type(m).__name__.lower() for m in layer.modules()]
    for piece, kind in _LAYER_KINDS:
        if any(piece in name for name in names):
            return kind
    return "no attention"


def attention_sites(model: torch.nn.Module, layers, attn: str | None) -> list[bool]:
    """Per layer of a family, whether its attention goes through the interface or an adapter."""
    if adapters.adapter_for(model) is not None:  # an adapter takes over every layer's attention
        return [True] * len(layers)
    out = []
    for layer in layers:
        try:
            scope = attention_module(layer, attn)
        except AttributeError:
            out.append(False)
            continue
        out.append(any(_calls_interface(type(m)) for m in scope.modules()))
    return out


# a module's own count of attention heads (of queries), under its common names
_HEAD_ATTRS = ("num_heads", "num_attention_heads", "n_heads", "n_head")


def _module_heads(layer: torch.nn.Module, attn: str | None) -> int | None:
    """The heads of a layer's attention as its attention module says (the module that calls
    transformers' attention interface), or None where no module says it or they disagree."""
    try:
        scope = attention_module(layer, attn)
    except AttributeError:
        return None
    counts = set()
    for m in scope.modules():
        if _calls_interface(type(m)):
            for name in _HEAD_ATTRS:
                value = m.__dict__.get(name)  # plain attributes only (not a config's property)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    counts.add(value)
                    break
    return counts.pop() if len(counts) == 1 else None


def _layer_heads(model_type: str, family: str, layers, attn: str | None, scored: list[int]) -> int | None:
    """The one head count of a family's attention layers as their modules say (None: they do not
    say); ModelError where layers have different counts: a family's maps are one
    [layer, head, query, key] array, one head count for all its layers."""
    said = {i: h for i in scored if (h := _module_heads(layers[i], attn)) is not None}
    if len(set(said.values())) > 1:
        i, a = next(iter(said.items()))
        j, b = next((k, h) for k, h in said.items() if h != a)
        raise ModelError(f"model type '{model_type}' has {family} layers with different numbers of attention heads"
                         f" (layer {i}: {a}, layer {j}: {b}); attattr keeps one head count per attention family"
                         " ([layer, head, query, key] maps), so it cannot attribute this configuration")
    return next(iter(said.values())) if said else None


def _refuse_shared_keys(config, model_type: str) -> None:
    """Refuse a model whose upper layers reuse the keys and values of a lower layer (Gemma 3n and
    Gemma 4 with ``num_kv_shared_layers``): attattr replays the clean output of the layers below
    a target layer instead of running them, and the keys and values those layers would hand up
    are then missing."""
    shared = getattr(config, "num_kv_shared_layers", None)
    if isinstance(shared, int) and not isinstance(shared, bool) and shared > 0:
        raise ModelError(f"model type '{model_type}' is not supported with num_kv_shared_layers = {shared}: its last"
                         f" {shared} layers reuse the keys and values of earlier layers, which attattr's per-layer"
                         " replay does not hand up yet; see docs/models.md for the supported architectures")


def arch_info(model: torch.nn.Module, tokenizer=None) -> ArchInfo:
    """The facts attattr needs about a model; ModelError (one line) for one it cannot attribute."""
    config = model.config
    model_type = getattr(config, "model_type", "unknown")
    adapters.check(model)
    _refuse_shared_keys(config, model_type)
    heads = _config_value(config, "num_attention_heads", "n_head", "n_heads", "num_heads",
                          "encoder_attention_heads")
    stacks = {"encoder": getattr(config, "encoder", None), "decoder": getattr(config, "decoder", None)}
    if heads is None and stacks["encoder"] is not None:  # an encoder and a decoder config (T5Gemma)
        heads = _config_value(stacks["encoder"], "num_attention_heads")
    if not _has_attention(model):
        raise ModelError(
            f"model type '{model_type}' ({type(model).__name__}) has no attention (no attention heads or"
            " modules): attattr attributes self-attention and supports transformer models (see docs/models.md)")
    path, layers = find_layers(model)
    routed = {name: attention_sites(model, flayers, attn) for name, _, attn, flayers in find_families(model)}
    if not any(any(r) for r in routed.values()):
        raise ModelError(
            f"model type '{model_type}' ({type(model).__name__}) computes its attention outside transformers'"
            " attention interface, and attattr has no adapter for it yet; see docs/models.md for the supported"
            " architectures")
    adapter = adapters.adapter_for(model)
    if adapter is not None and adapter.num_heads(model) is not None:
        heads = adapter.num_heads(model)
    if heads is None or not int(heads):
        raise ModelError(f"model type '{model_type}' ({type(model).__name__}): its config names no number of attention"
                         " heads attattr can read; see docs/models.md for the supported architectures")
    max_len = _config_value(config, "max_position_embeddings", "n_positions")
    if max_len is not None and int(max_len) < 1:  # -1: no limit (XLNet)
        max_len = None
    if max_len is not None:
        max_len = int(max_len) - POSITION_OFFSET.get(model_type, 0)
    tok_max = getattr(tokenizer, "model_max_length", None) if tokenizer is not None else None
    if tok_max is not None and tok_max < 1_000_000:
        max_len = min(max_len, int(tok_max)) if max_len is not None else int(tok_max)
    encoder = ENCODER_PATHS.get(model_type) if find_encoder(model) is not None else None
    is_decoder = encoder is None and _causal(model)
    families = []
    for name, fpath, attn, flayers in find_families(model):
        side = "decoder" if name in ("decoder", "cross") else "encoder"
        fheads = heads if name == "self" else _config_value(config, f"{side}_attention_heads", "num_attention_heads",
                                                            "num_heads")
        stack = stacks[side]
        if stack is not None and hasattr(stack, "num_attention_heads"):  # the stack's own config (T5Gemma)
            fheads = _config_value(stack, "num_attention_heads") or fheads
        skip = tuple((i, _layer_kind(layer)) for i, (layer, ok) in enumerate(zip(flayers, routed[name])) if not ok)
        for i, kind in skip:
            if kind == "no attention" and _has_attention(flayers[i]):  # attention of its own, not a hybrid's layer
                raise ModelError(
                    f"model type '{model_type}' computes its attention ({name} layer {i}) outside transformers'"
                    " attention interface, and attattr has no adapter for it yet; see docs/models.md for the"
                    " supported architectures")
        if adapter is None or adapter.num_heads(model) is None:  # the modules' own count, where they say it
            fheads = _layer_heads(model_type, name, flayers, attn,
                                  [i for i in range(len(flayers)) if i not in dict(skip)]) or fheads
        families.append(FamilyInfo(name, fpath, attn, len(flayers), int(fheads),
                                   "decoder" if side == "decoder" else "input",
                                   "decoder" if name == "decoder" else "input", skip))
    if families and families[0].name == "self":  # the modules' count where it is not the config's
        heads = families[0].num_heads
    types = getattr(model.config, "type_vocab_size", None)
    return ArchInfo(model_type, path, len(layers), int(heads), is_decoder, max_len, tuple(families), encoder,
                    types if isinstance(types, int) and not isinstance(types, bool) else None)
