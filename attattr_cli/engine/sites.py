"""Attention sites and families: which attention calls a run attributes, and how a pass
for one target site is set up.

A *site* is ``(family, layer)``. Encoder-only and decoder-only models have the one family
``self``; encoder-decoder models (BART) have ``encoder`` ([head, input token, input token]),
``decoder`` ([head, decoder token, decoder token], causal) and ``cross`` ([head, decoder token,
input token]). A target site's pass replays the layers below it from the clean forward; for
``decoder`` and ``cross`` targets the encoder's clean output is handed to the model
(``encoder_outputs``) and the encoder never runs. docs/models.md, "Families" and "How one target
site is integrated".
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from ..errors import OptionError
from ..models.arch import FAMILY_DOC, ArchInfo, FamilyInfo, find_encoder, find_families
from . import attention

Site = tuple  # (family: str, layer: int)


@dataclass
class Clean:
    """What the clean forward leaves for the integration passes."""

    outputs: dict  # layer-list path -> {layer index: output of that layer}
    encoder_out: torch.Tensor | None = None  # [1, n, hidden] for encoder-decoder models
    # layer-list path -> {layer index: (shapes of its positional arguments, of its keyword
    # arguments)}: a sweep (engine/sweep.py) tells the batch axis of an argument by them
    arg_shapes: dict | None = None
    # its tensors are the scorer's static slots: captured passes over it are keyed by shapes
    # (engine/layer_integral.py, Integration.bind_static)
    static: bool = False


class SiteScorer:
    """The families of one model and the set-up of a pass for one target site."""

    def __init__(self, model: torch.nn.Module, arch: ArchInfo):
        self.model = model
        self.arch = arch
        self._lists = {name: (path, layers) for name, path, _attn, layers in find_families(model)}
        # integration passes need the last layer only at the first token where the head reads only that
        self._first_token = attention.first_token_output(model, self._lists["self"][1]) \
            if "self" in self._lists else None
        self.encoder = find_encoder(model)

    # -- families -----------------------------------------------------------------
    @property
    def families(self) -> list[FamilyInfo]:
        return list(self.arch.families)

    def choose(self, wanted: list[str] | None) -> list[FamilyInfo]:
        """The families to score (None: all), in the model's order."""
        if wanted is None:
            return self.families
        names = self.arch.family_names
        for w in wanted:
            if w not in names:
                have = "; ".join(f"{n} ({FAMILY_DOC.get(n, '')})" for n in names)
                raise OptionError(f"unknown attention family '{w}' for this {self.arch.model_type} model; it has: {have}")
        return [f for f in self.families if f.name in wanted]

    # -- the clean forward ----------------------------------------------------------
    @contextlib.contextmanager
    def capture(self):
        """Hooks that keep every layer's output (per layer list) and the encoder's output."""
        clean = Clean(outputs={}, arg_shapes={})
        hooks = []
        seen = set()
        try:
            for path, layers in self._lists.values():
                if path in seen:
                    continue
                seen.add(path)
                store = clean.outputs.setdefault(path, {})
                shapes = clean.arg_shapes.setdefault(path, {})
                for i, layer in enumerate(layers):
                    def keep(m, a, kw, o, _s=store, _a=shapes, _i=i):
                        _s[_i] = o
                        _a[_i] = (attention.shapes_of(a), {k: attention.shapes_of(v) for k, v in kw.items()})
                    hooks.append(layer.register_forward_hook(keep, with_kwargs=True))
            if self.encoder is not None:
                def keep_encoder(m, a, o):
                    clean.encoder_out = o[0] if isinstance(o, (tuple, list)) else o.last_hidden_state
                hooks.append(self.encoder.register_forward_hook(keep_encoder))
            yield clean
        finally:
            for h in hooks:
                h.remove()

    # -- one integration pass ---------------------------------------------------------
    def extra_inputs(self, site: Site, clean: Clean, batch: int) -> dict:
        """Model inputs a pass for ``site`` needs beyond the token ids."""
        if site[0] in ("decoder", "cross") and clean.encoder_out is not None:
            from transformers.modeling_outputs import BaseModelOutput

            hidden = clean.encoder_out.detach()
            return {"encoder_outputs": BaseModelOutput(last_hidden_state=hidden.expand(batch, *hidden.shape[1:]))}
        return {}

    @contextlib.contextmanager
    def target_pass(self, site: Site, clean: Clean, plan):
        """Replay the layers below the target, compute the target layer's projections once,
        and route the target's attention through ``plan``."""
        family, layer = site
        path, layers = self._lists[family]
        replay = clean.outputs.get(path, {}).get(layer - 1)
        batch = len(plan.alphas)
        owner = getattr(plan, "owner", None)  # several examples per pass: the example of each row
        with attention.replayed_below(layers, layer, replay, batch, owner), \
                attention.first_token_only(self._first_token if family == "self" else None), \
                attention.projections_once(layers[layer], plan), attention.active(plan):
            yield

    def sweepable(self, family: str) -> bool:
        """Whether passes for several target layers of ``family`` can share a sweep
        (:class:`~attattr_cli.engine.attention.Sweep`): a decoder-only or encoder-only model's
        own layer list, each layer its own module."""
        if family != "self" or self.encoder is not None or family not in self._lists:
            return False
        layers = self._lists[family][1]
        return not getattr(layers, "shared_calls", False) and len({id(m) for m in layers}) == len(layers)

    @contextlib.contextmanager
    def sweep_pass(self, family: str, clean: Clean, plan):
        """Set up one sweep (engine/sweep.py) through ``family``'s layers."""
        path, layers = self._lists[family]
        with attention.swept(layers, plan, clean.outputs.get(path, {}), len(plan.alphas),
                             (clean.arg_shapes or {}).get(path, {})), \
                attention.first_token_only(self._first_token if family == "self" else None), attention.active(plan):
            yield

