"""What one scored example holds: :class:`ExampleScore` and its per-family :class:`FamilyScore`."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class FamilyScore:
    """One attention family's results for one example (see docs/store.md)."""

    name: str
    layers: list[int]
    heads: int
    query_side: str  # "input" (the input tokens) or "decoder" (the decoder input tokens)
    key_side: str
    keep: str  # maps | sum | none | sources
    attribution: np.ndarray | None  # [layer, head, q, k] (keep maps)
    head_sum: np.ndarray | None  # [layer, q, k] (keep maps or sum)
    head_max: np.ndarray  # [layer, head]
    attention: np.ndarray | None  # [all layers, head, q, k] (maps) or [all layers, q, k] head mean (sum)
    f_baseline: np.ndarray  # [layer]
    residual: np.ndarray  # [layer]
    topk_index: np.ndarray | None = None  # [layer, head, k, 2] (query, key)
    topk_value: np.ndarray | None = None  # [layer, head, k]
    nodes: np.ndarray | None = None  # [layer] integration nodes used
    error: np.ndarray | None = None  # [layer] estimated max |error of Attr| / max |Attr|
    capped: np.ndarray | None = None  # [layer] tol: the node cap was hit before the tolerance
    status: np.ndarray | None = None  # [layer] convergence state (attattr_cli/convergence.py: CONVERGED, CAP_HIT, ...)
    status_tol: float | None = None  # the tolerance the states were judged at
    key_sum: np.ndarray | None = None  # [layer, key] (keep sources): summed over heads and queries
    # [layer, key] (keep sources): summed over heads and the query rows that read the passages (from
    # the end of the last one on: the question, the template's tail, the answer's rows; data/sources.py)
    read_sum: np.ndarray | None = None


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
    families: dict = field(default_factory=dict)  # name -> FamilyScore
    decoder_tokens: list[str] | None = None
    decoder_input_ids: np.ndarray | None = None
    step_batch: int = 0  # steps per pass used (largest)
    nonfinite: list[str] = field(default_factory=list)  # parts holding NaN or inf (see assembly.nonfinite_parts)
    steps: list | None = None  # a generation: one engine.generation.StepScore per generated token
