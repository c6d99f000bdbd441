"""The text model types transformers maps to a sequence classifier or a causal language model,
read from transformers' own auto mappings (so a new transformers release shows its new types).

``python -m attattr_cli.models.catalog`` prints them, one a line, with the attention class
attattr gives each at load (see docs/models.md; the checked state of every type is the table
``tests/arch_catalog.py`` writes there)."""

from __future__ import annotations

# sub-configs that make a model multimodal (set aside: attattr attributes text)
_OTHER_MODALITIES = ("vision", "audio", "vq", "image", "speech")
# multimodal or non-text models whose config holds no such sub-config
_NOT_TEXT = frozenset({"fuyu", "whisper", "trocr", "gemma4_assistant", "gemma4_unified_assistant",
                       "layoutlmv2", "layoutlmv3"})


def mapped_types() -> list[str]:
    """Every model type transformers maps to ``AutoModelForSequenceClassification`` or
    ``AutoModelForCausalLM``, sorted."""
    from transformers.models.auto import modeling_auto as ma

    return sorted(set(ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES) | set(ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES))


def is_text(model_type: str) -> bool:
    """Whether ``model_type`` is a text model (no vision, audio or image part in its config)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if model_type in _NOT_TEXT:
        return False
    subs = getattr(CONFIG_MAPPING[model_type], "sub_configs", None) or {}
    return not any(m in name for name in subs for m in _OTHER_MODALITIES)


def text_types() -> list[str]:
    """The mapped text model types (multimodal ones set aside), sorted."""
    return [t for t in mapped_types() if is_text(t)]


if __name__ == "__main__":
    for name in text_types():
        print(name)
