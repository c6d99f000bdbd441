"""What the API functions share: inputs as examples, the model and data resolved the way
``score`` does, stores or results opened for reading, small argument checks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from ..data.tasks import TASKS  # noqa: F401  (the task presets, whose names the CLI's help lists)
from ..errors import OptionError, StoreError
# the output rule and strict JSON, for the commands too (they import the api, nothing below it)
from ..fileio import FULL, check_output, is_stream, no_space, os_errno  # noqa: F401,E402
from ..fileio import dumps as strict_dumps  # noqa: F401,E402
from ..store import Store
from .model import as_model
from .results import Attribution, Results, StoreView

API_COMMAND = ["python", "attattr_cli.api"]


def to_examples(inputs) -> list:
    """Texts, (first, second) pairs, dicts with text_a/text_b/label, ``Example`` objects or
    counterfactual ``Pair`` objects (data/pairs.py), as
    a list of ``Example`` (indices 0, 1, ... unless the examples carry their own)."""
    from ..data.tasks import check_text
    from ..data.types import Example

    if isinstance(inputs, (str, Example)) or (isinstance(inputs, tuple) and len(inputs) == 2
                                              and all(isinstance(x, str) for x in inputs)):
        inputs = [inputs]
    from ..data.pairs import Pair, as_examples

    out = []
    for i, x in enumerate(inputs):
        if isinstance(x, Pair):  # a clean / counterfactual pair (data/pairs.py): its answer and foil in meta
            out.extend(as_examples([x]))
        elif isinstance(x, Example):
            out.append(x)
        elif isinstance(x, str):
            out.append(Example(i, x))
        elif isinstance(x, (tuple, list)) and len(x) == 2 and all(isinstance(t, str) for t in x):
            out.append(Example(i, x[0], x[1]))
        elif isinstance(x, dict) and "text_a" in x:
            for key in ("text_a", "text_b"):
                if key in x and not (isinstance(x[key], str) or (key == "text_b" and x[key] is None)):
                    raise OptionError(f"inputs[{i}]['{key}'] must be a text, not {type(x[key]).__name__}")
            index = x.get("index", i)
            if isinstance(index, bool) or not isinstance(index, int):
                raise OptionError(f"inputs[{i}]['index'] must be a whole number, not {type(index).__name__}")
            out.append(Example(index, x["text_a"], x.get("text_b"), x.get("label")))
        else:
            raise OptionError(f"inputs[{i}] must be a text, a (text, text) pair or an Example, not {type(x).__name__}")
        for key, text in (("text_a", out[-1].text_a), ("text_b", out[-1].text_b)):
            if text is not None:
                check_text(text, f"inputs[{i}] {key}")
    if not out:
        raise OptionError("inputs is empty")
    if len({e.index for e in out}) != len(out):
        raise OptionError("inputs have repeated indices")
    return out


def pairs_given(data, inputs) -> bool:
    """Whether the inputs are clean / counterfactual pairs: a pairs JSONL ``data`` or ``Pair`` inputs."""
    from ..data.pairs import Pair, is_pairs_file

    return (isinstance(data, (str, Path)) and is_pairs_file(data)) or (
        isinstance(inputs, (list, tuple)) and bool(inputs) and all(isinstance(x, Pair) for x in inputs))


def model_arg(model) -> tuple[str | None, list[str] | None]:
    """(model id for resolving data, label names when already loaded) of a model argument."""
    if model is None or isinstance(model, (str, Path)):
        return (None if model is None else str(model)), None
    m = as_model(model)
    return (m.path or "memory"), (None if m.loaded.lm else m.label_names)


def default_task(model_id: str | None, data, task, inputs):
    """With no inputs, data or task: the synthetic task for the built-in model; else an error."""
    if inputs is not None or data is not None or task is not None or model_id is None:
        return task
    from ..models.default import DEFAULT_MODEL_DIR

    if model_id != "memory" and Path(model_id).exists() and Path(model_id).resolve() == DEFAULT_MODEL_DIR.resolve():
        return "synthetic"
    raise OptionError("give inputs (texts or pairs), data or task for this model")


def model_and_data(model=None, data=None, task=None, examples=None, inputs=None, *, device: str = "auto",
                   dtype: str = "float32", check_words: bool = True):
    """The one place models and data are resolved the way ``score`` does: returns
    (Model, task or None, picked examples, label map, all examples, task label names).
    ``check_words``: one warning when most tokens of some picked examples are the tokenizer's
    unknown token (as ``score`` warns; off where ``score`` runs on them next)."""
    from ..data import get_task, parse_examples
    from ..engine.run import resolve_inputs
    from ..models.loading import align_labels

    if model is not None and not isinstance(model, (str, Path)):
        model = as_model(model)  # once: wrapping a (model, tokenizer) pair hashes its weights
    model_id, names = model_arg(model)
    task = default_task(model_id, data, task, inputs)
    if inputs is not None:
        if data is not None:
            raise OptionError("give inputs or data, not both")
        rows = to_examples(inputs)
        task_obj = get_task(task) if task is not None else None
        labels = list(task_obj.labels) if task_obj is not None else None
    else:
        resolved, task_obj, rows, labels = resolve_inputs(model_id, data, task, names)
        if model is None:
            model = resolved
    picked = [rows[i] for i in parse_examples(examples, len(rows))]
    m = as_model(model, device=device, dtype=dtype)
    label_map, _ = align_labels(labels, m.loaded)
    if check_words and not m.loaded.lm:
        from ..engine.encoding import encode, unknown_words

        note = unknown_words(m.tokenizer, {e.index: encode(m.tokenizer, e, tokens=False) for e in picked}, m.id)
        if note:
            from ..errors import warn_user

            warn_user(note)  # at the caller of the API function
    return m, task_obj, picked, label_map, rows, labels


def command_of(command) -> list[str]:
    return list(command) if command else list(API_COMMAND)


def selection(examples) -> str | None:
    """``examples`` (a selection string, or indices) as a selection string."""
    if examples is None or isinstance(examples, str):
        return examples
    try:
        items = list(examples)
    except TypeError:
        items = None
    if items is None or not all(isinstance(i, int) and not isinstance(i, bool) for i in items):
        raise OptionError(f"examples must be a selection such as '0:100' or a list of indices, got {examples!r}")
    return ",".join(str(i) for i in items)


def check_methods_given(methods, name: str = "methods") -> None:
    """Refuse, before any work, ``methods`` given but naming none ("" or " , "): an empty
    list is not the default."""
    if methods is None:
        return
    names = methods.split(",") if isinstance(methods, str) else methods
    if isinstance(names, (list, tuple)) and not [m for m in names if not isinstance(m, str) or m.strip()]:
        raise OptionError(f"{name} is empty: give method names (comma-separated), or leave it out for the default")


def check_outputs(outputs: dict, inputs) -> None:
    """The output rule before any work (fileio.check_output): no output (``{argument: path}``)
    is the same file as one of ``inputs`` (paths; other values ignored)."""
    for name, out in outputs.items():
        check_output(out, [i for i in inputs if isinstance(i, (str, os.PathLike, list, tuple))], name)


def open_source(source):
    """(a Store-like reader, its closer) for a path, a StoreView, a Store or a Results list."""
    if isinstance(source, StoreView):
        return source.store, (lambda: None)
    if isinstance(source, Store):
        return source, (lambda: None)
    if isinstance(source, Results) or (isinstance(source, list) and source and isinstance(source[0], Attribution)):
        return _InMemory(source), (lambda: None)
    if isinstance(source, (str, Path)):
        st = Store(source)
        return st, st.close
    raise OptionError(f"source must be a store path, an open store or results of score(), not {type(source).__name__}")


class _InMemory:
    """Results of :func:`score` read like a store (for importance and triggers)."""

    def __init__(self, results):
        self.results = {int(e.index): e for e in results}
        self.path = "results"
        first = results[0]
        shape = np.shape(first.head_max)
        self.provenance = {"label_names": list(first.label_names or []), "model": "results",
                           "num_layers": int(max(first.layers) + 1) if len(first.layers) else int(shape[0]),
                           "num_heads": int(shape[1])}
        self.fingerprint = {}

    def indices(self) -> list[int]:
        return sorted(self.results)

    def flagged(self) -> list[int]:
        """Results holding NaN or inf (as a store flags them, see docs/store.md)."""
        def bad(e) -> bool:
            if getattr(e, "nonfinite", None):
                return True
            return any(x is not None and not np.isfinite(np.asarray(x, np.float64)).all()
                       for x in (getattr(e, "logits", None), getattr(e, "head_max", None)))

        return [i for i in self.indices() if bad(self.results[i])]

    finite = Store.finite

    def unconverged(self, indices) -> list[int]:
        """Results with a layer whose integral is not converged (as a store says it)."""
        from .. import convergence

        return [i for i in indices
                if convergence.unconverged(getattr(self.results[i], "convergence", None)).any()]

    def families(self) -> list[str]:
        return list(dict.fromkeys(e.family for e in self.results.values()))

    def get(self, index: int, arrays: bool = True, family: str | None = None):
        if index not in self.results:
            raise StoreError(f"example {index} is not in the results")
        return self.results[index]
