"""T5Gemma: Gemma layers as an encoder and a decoder, through the attention interface. Its
sequence classifier sets ``use_cache=False`` itself when it calls the encoder-decoder, so the
flag attattr passes every encoder-decoder (no key/value cache at batch m) is dropped there while
the model is taken over."""

from __future__ import annotations

from . import Adapter, register


@register
class T5Gemma(Adapter):
    model_types = ("t5gemma",)

    def install_model(self, model):
        if type(model).__name__ != "T5GemmaForSequenceClassification":
            return []
        forward = model.forward

        def without_cache_flag(*args, use_cache=None, **kwargs):
            return forward(*args, **kwargs)

        model.forward = without_cache_flag
        return [lambda: model.__dict__.pop("forward", None)]
