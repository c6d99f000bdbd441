"""Attention attribution of one example, all (or chosen) layers, all heads.

Attr_h(A) = A_h * integral_0^1 dF(alpha A)/dA_h d alpha   (Hao et al. 2021, eq. 1)

computed with the algebra of METHOD.md section 1: the clean forward runs once at batch 1
and keeps every layer's input; for each target layer the steps run as a batch in which
the layers below are replayed (not recomputed), the target layer's output for step k is
alpha_k * (A V), and the gradient is taken only with respect to that output. Then
Attr = A * (G V^T) with G = sum_k w_k dF/dO_k. No tensor of size steps x heads x n x n
is ever built.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np
import torch

from ..data.types import Example
from ..errors import DataError, OptionError, ResourceError
from ..models.loading import LoadedModel, align_labels, resolve_dtype
from ..ops import select_backend
from . import attention
from .integrate import RULES, nodes

OUTPUTS = ("prob", "logit")


@dataclass
class ScoreOptions:
    """What defines a run's numbers (everything but ``step_batch``, ``kernel`` changes them)."""

    steps: int = 20
    rule: str = "right"
    target: str = "predicted"  # predicted | gold | a label name | a label index
    output: str = "prob"  # prob | logit
    layers: list[int] | None = None  # None: all layers
    dtype: str = "float32"
    truncate: bool = False
    step_batch: int | None = None  # steps per forward/backward; None: all at once
    kernel: str = "auto"

    def validate(self, num_layers: int) -> list[int]:
        if self.rule not in RULES:
            raise OptionError(f"unknown rule '{self.rule}'; available: {', '.join(RULES)}")
        if self.output not in OUTPUTS:
            raise OptionError(f"unknown output '{self.output}'; available: {', '.join(OUTPUTS)}")
        if self.steps < 1:
            raise OptionError(f"--steps must be at least 1, got {self.steps}")
        if self.step_batch is not None and self.step_batch < 1:
            raise OptionError(f"--step-batch must be at least 1, got {self.step_batch}")
        resolve_dtype(self.dtype)
        layers = list(range(num_layers)) if self.layers is None else list(self.layers)
        for layer in layers:
            if not -num_layers <= layer < num_layers:
                raise OptionError(f"layer {layer} does not exist: the model has {num_layers} layers (0..{num_layers - 1})")
        layers = sorted({layer % num_layers for layer in layers})
        return layers

    def fingerprint(self, num_layers: int) -> dict:
        """The options that must agree for two runs to share a store."""
        d = asdict(self)
        d.pop("step_batch")
        d.pop("kernel")
        d["layers"] = self.validate(num_layers)
        return d


@dataclass
class Encoded:
    input_ids: list[int]
    tokens: list[str]
    segment_ids: list[int]  # 0, 1 for the segments, -1 for special tokens
    token_type_ids: list[int] | None
    truncated: bool = False


@dataclass
class ExampleScore:
    """Everything the store keeps about one example. Arrays are numpy, float32 (or float64)."""

    index: int
    tokens: list[str]
    input_ids: np.ndarray  # [n]
    segment_ids: np.ndarray  # [n]
    gold: int  # model label index, -1 if unknown
    pred: int
    target: int
    logits: np.ndarray  # [labels]
    probs: np.ndarray  # [labels]
    layers: list[int]
    attribution: np.ndarray  # [layer, head, query_pos, key_pos] for `layers`
    attention: np.ndarray  # [layer, head, query_pos, key_pos] for all layers
    head_max: np.ndarray  # [layer, head]
    f_full: float  # F at alpha = 1
    f_baseline: np.ndarray  # [layer] F with the layer's attention at 0
    residual: np.ndarray  # [layer] sum Attr - (F(A) - F(0))
    kernel: str
    truncated: bool = False
    meta: dict = field(default_factory=dict)
    text_a: str = ""
    text_b: str | None = None


class Scorer:
    """Scores examples with one model and one set of options."""

    def __init__(self, loaded: LoadedModel, options: ScoreOptions, task_labels=None):
        self.loaded = loaded
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.options = options
        self.layers = options.validate(loaded.arch.num_layers)
        self.device = next(self.model.parameters()).device
        self.dtype = resolve_dtype(options.dtype)
        if next(self.model.parameters()).dtype != self.dtype:
            self.model.to(self.dtype)
        self.backend = select_backend(options.kernel, self.device)
        self.label_map, self.label_how = align_labels(task_labels, loaded)
        self.task_labels = list(task_labels) if task_labels is not None else loaded.label_names
        self.alphas, self.weights = nodes(options.rule, options.steps)
        self._fixed_target = self._parse_target(options.target)
        self._chunk_limit: int | None = None  # lowered by the out-of-memory back-off, kept for later examples
        self._warned_oom = False
        self.warn: Callable[[str], None] | None = None  # where the back-off says so once; None: warnings.warn

    # -- targets ---------------------------------------------------------------
    def _parse_target(self, target: str) -> int | None:
        if target in ("predicted", "gold"):
            return None
        names = [n.lower() for n in self.loaded.label_names]
        if target.lower() in names:
            return names.index(target.lower())
        task_names = [n.lower() for n in self.task_labels]
        if target.lower() in task_names:
            return self.label_map[task_names.index(target.lower())]
        if target.lstrip("-").isdigit() and 0 <= int(target) < len(names):
            return int(target)
        raise OptionError(
            f"unknown target '{target}'; use predicted, gold, a label index or one of: "
            + ", ".join(self.loaded.label_names)
        )

    def _target_value(self, logits: torch.Tensor, target: int) -> torch.Tensor:
        work = logits.to(torch.float64 if logits.dtype == torch.float64 else torch.float32)
        if self.options.output == "logit":
            return work[:, target]
        return torch.softmax(work, dim=-1)[:, target]

    # -- encoding --------------------------------------------------------------
    def encode(self, example: Example) -> Encoded:
        tok = self.tokenizer
        limit = self.loaded.arch.max_length
        args = (example.text_a,) if example.text_b is None else (example.text_a, example.text_b)
        enc = tok(*args, add_special_tokens=True)
        truncated = False
        if limit is not None and len(enc["input_ids"]) > limit:
            if not self.options.truncate:
                raise DataError(
                    f"example {example.index} has {len(enc['input_ids'])} tokens; the model takes at most {limit}"
                    " (pass --truncate to cut long inputs)"
                )
            enc = tok(*args, add_special_tokens=True, truncation=True, max_length=limit)
            truncated = True
        ids = list(enc["input_ids"])
        try:
            seq = enc.sequence_ids()
            segments = [-1 if s is None else int(s) for s in seq]
        except (ValueError, AttributeError):
            segments = list(enc.get("token_type_ids", [0] * len(ids)))
        tt = list(enc["token_type_ids"]) if "token_type_ids" in enc and "token_type_ids" in tok.model_input_names else None
        return Encoded(ids, tok.convert_ids_to_tokens(ids), segments, tt, truncated)

    # -- scoring ---------------------------------------------------------------
    def _inputs(self, enc: Encoded, batch: int) -> dict:
        ids = torch.tensor([enc.input_ids], device=self.device)
        inputs = {"input_ids": ids.expand(batch, -1)}
        if enc.token_type_ids is not None:
            inputs["token_type_ids"] = torch.tensor([enc.token_type_ids], device=self.device).expand(batch, -1)
        return inputs

    def score(self, example: Example, encoded: Encoded | None = None,
              on_layer: Callable[[int], None] | None = None) -> ExampleScore:
        """Score one example. Step micro-batches that run out of memory are halved and retried
        (said once through ``self.warn``); memory that runs out anyway raises ResourceError."""
        enc = encoded or self.encode(example)
        try:
            return self._score(example, enc, on_layer)
        except RuntimeError as exc:
            if not is_out_of_memory(exc):
                raise
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            raise ResourceError(
                f"out of memory on {self.device} for example {example.index} ({len(enc.input_ids)} tokens)"
                " outside the integration steps (the clean forward pass or the attribution maps):"
                " use a smaller model, --dtype bfloat16, --truncate, or a device with more memory"
            ) from exc

    def _score(self, example: Example, enc: Encoded,
               on_layer: Callable[[int], None] | None = None) -> ExampleScore:
        model = self.model
        with attention.taken_over(model) as layer_list:
            outputs: dict[int, object] = {}
            hooks = [
                layer.register_forward_hook(lambda m, a, o, _i=i: outputs.__setitem__(_i, o))
                for i, layer in enumerate(layer_list)
            ]
            # alpha = 1 is the clean forward for every target layer: when the rule has that
            # node, one backward of the clean forward gives its gradient for all layers
            share_one = bool((self.alphas == 1).any()) and bool(self.layers)
            record = attention.Record(grad_layers=frozenset(self.layers) if share_one else frozenset())
            try:
                with torch.set_grad_enabled(share_one), attention.active(record):
                    logits_g = model(**self._inputs(enc, 1)).logits
            finally:
                for h in hooks:
                    h.remove()
            logits = logits_g.detach()
            pred = int(logits[0].argmax())
            gold = -1 if example.label is None else self.label_map[example.label]
            target = self._choose_target(pred, gold, example)
            f_full = float(self._target_value(logits, target)[0])
            at_one = {}
            if share_one:
                wanted = [layer for layer in self.layers if layer in record.leaves]
                grads = torch.autograd.grad(self._target_value(logits_g, target).sum(), [record.leaves[x] for x in wanted])
                at_one = dict(zip(wanted, grads))
                outputs = {i: _detached(o) for i, o in outputs.items()}
            del logits_g, record.leaves

            n_layers = len(layer_list)
            n = len(enc.input_ids)
            attn_all = torch.stack([record.probs[i][0] for i in range(n_layers)]).float().cpu().numpy()
            maps, head_max, f_base, resid = [], [], [], []
            for layer in self.layers:
                g, f0 = self._integrate(enc, layer, target, layer_list, outputs, at_one.get(layer))
                res = self._attribute(layer, g)
                m = res["maps"][0]
                maps.append(m.cpu())
                head_max.append(res["head_max"][0].cpu())
                f_base.append(f0)
                resid.append(float(m.sum()) - (f_full - f0))
                if on_layer is not None:
                    on_layer(layer)
        probs = torch.softmax(logits[0].double(), -1)
        return ExampleScore(
            index=example.index,
            tokens=enc.tokens,
            input_ids=np.asarray(enc.input_ids, dtype=np.int64),
            segment_ids=np.asarray(enc.segment_ids, dtype=np.int8),
            gold=gold,
            pred=pred,
            target=target,
            logits=logits[0].double().cpu().numpy(),
            probs=probs.cpu().numpy(),
            layers=list(self.layers),
            attribution=torch.stack(maps).numpy() if maps else np.zeros((0, 0, n, n), np.float32),
            attention=attn_all,
            head_max=torch.stack(head_max).numpy() if head_max else np.zeros((0, 0), np.float32),
            f_full=f_full,
            f_baseline=np.asarray(f_base, dtype=np.float64),
            residual=np.asarray(resid, dtype=np.float64),
            kernel=getattr(self, "last_kernel", self.backend.name),
            truncated=enc.truncated,
            meta=dict(example.meta),
            text_a=example.text_a,
            text_b=example.text_b,
        )

    def _choose_target(self, pred: int, gold: int, example: Example) -> int:
        if self._fixed_target is not None:
            return self._fixed_target
        if self.options.target == "gold":
            if gold < 0:
                raise DataError(f"example {example.index} has no gold label; --target gold needs one")
            return gold
        return pred

    def _integrate(self, enc: Encoded, layer: int, target: int, layer_list, outputs,
                   grad_at_one: torch.Tensor | None = None) -> tuple[torch.Tensor, float]:
        """G = sum_k w_k dF/dO_k for the target layer, and F with the layer's attention at 0.

        ``grad_at_one`` is dF/dO at alpha = 1 from the clean forward's backward; that node
        is then not recomputed.
        """
        acc_dtype = torch.float64 if self.dtype == torch.float64 else torch.float32
        alphas, weights = self.alphas, self.weights
        g_sum = None
        if grad_at_one is not None:
            one = alphas == 1
            g_sum = (grad_at_one.to(acc_dtype) * weights[one].sum().item())
            alphas, weights = alphas[~one], weights[~one]
        zero = torch.nonzero(alphas == 0)
        zero_at = int(zero[0]) if len(zero) else None
        f0 = float("nan")
        replay = outputs.get(layer - 1)
        chunk = min(self.options.step_batch or max(len(alphas), 1), self._chunk_limit or max(len(alphas), 1))
        start = 0
        while start < len(alphas):
            a = alphas[start:start + chunk]
            w = weights[start:start + chunk].to(self.device, acc_dtype)
            failed = None
            try:
                part, f, saved = self._step_chunk(enc, layer, target, layer_list, replay, a, w)
            except RuntimeError as exc:  # torch.cuda.OutOfMemoryError is a RuntimeError
                if not is_out_of_memory(exc):
                    raise
                failed = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            if failed is not None:  # out of the except block: the failed pass's tensors are free now
                chunk = self._back_off(len(a), failed)
                continue
            g_sum = part if g_sum is None else g_sum + part
            if zero_at is not None and start <= zero_at < start + len(a):
                f0 = float(f[zero_at - start])
            self._saved = saved
            start += len(a)
        if zero_at is None:  # F(0): one forward at batch 1, no backward
            plan = attention.Attribute(layer, torch.zeros(1, dtype=torch.float64, device=self.device), self.backend)
            with self._pass(layer_list, layer, replay, plan), torch.no_grad():
                f0 = float(self._target_value(self.model(**self._inputs(enc, 1)).logits, target)[0])
            if g_sum is None or not hasattr(self, "_saved") or self._saved.get("layer") != layer:
                self._saved = plan.saved
        self._saved["layer"] = layer
        return g_sum, f0

    def _step_chunk(self, enc: Encoded, layer: int, target: int, layer_list, replay,
                    a: torch.Tensor, w: torch.Tensor):
        """One micro-batch of steps: (sum of w_k dF/dO_k over it, F at its alphas, saved Q/K/V)."""
        acc_dtype = w.dtype
        plan = attention.Attribute(layer, a.to(self.device), self.backend)
        with self._pass(layer_list, layer, replay, plan), torch.enable_grad():
            logits = self.model(**self._inputs(enc, len(a))).logits
            f = self._target_value(logits, target)
            if plan.leaf is None:
                raise RuntimeError(f"layer {layer}'s attention was not routed through attattr")
            (g,) = torch.autograd.grad((f * w).sum(), plan.leaf)
        return g.to(acc_dtype).sum(0, keepdim=True), f.detach(), plan.saved

    def _back_off(self, size: int, reason: str) -> int:
        """A micro-batch of ``size`` steps ran out of memory (``reason``): the next size to try,
        or ResourceError at one step."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()
        if size <= 1:
            raise ResourceError(
                f"out of memory on {self.device} even with one integration step per pass"
                f" ({self.loaded.arch.num_layers} layers, dtype {self.options.dtype}): use a smaller model,"
                f" --dtype bfloat16, --layers, or a device with more memory ({reason})"
            )
        smaller = max(size // 2, 1)
        self._chunk_limit = smaller
        if not self._warned_oom:
            self._warned_oom = True
            message = (f"out of memory with {size} integration steps per pass on {self.device}; "
                       f"halving the step micro-batch (now {smaller}, and lower if needed). "
                       "Results do not change; pass --step-batch to start lower.")
            if self.warn is not None:
                self.warn(message)
            else:
                warnings.warn(message, ResourceWarning, stacklevel=2)
        return smaller

    @contextlib.contextmanager
    def _pass(self, layer_list, layer, replay, plan):
        batch = len(plan.alphas)
        with attention.replayed_below(layer_list, layer, replay, batch), \
                attention.projections_once(layer_list[layer], plan), attention.active(plan):
            yield

    def _attribute(self, layer: int, g: torch.Tensor) -> dict:
        s = self._saved
        self.last_kernel = self.backend.name if self.backend.supports(s["q"], s["mask"], s["softcap"]) else "torch"
        return self.backend.attribution_from_grad(
            s["q"], s["k"], s["v"], g, mask=s["mask"], scale=s["scale"], softcap=s["softcap"],
            causal=s["causal"],
        )


def is_out_of_memory(exc: BaseException) -> bool:
    """True for torch.cuda.OutOfMemoryError and the RuntimeErrors other backends raise when memory runs out."""
    oom_type = getattr(torch, "OutOfMemoryError", None) or getattr(torch.cuda, "OutOfMemoryError", None)
    if oom_type is not None and isinstance(exc, oom_type):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "not enough memory" in text)


def _detached(obj):
    if torch.is_tensor(obj):
        return obj.detach()
    if isinstance(obj, tuple):
        return tuple(_detached(o) for o in obj)
    return obj
