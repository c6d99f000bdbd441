"""Import the outputs of the 2021 reference code (github.com/YRdddream/attattr) into a store:
its per-example attribution files ``attr_zero_base_exp{I}.json`` (JSON lines, one
``[heads][n][n]`` list per layer), optional attention files ``att_score_zero_base_exp{I}.json``
of the same layout, and a tokens file ``tokens_and_pred_{N}.json``. The store gets
``attattr score``'s schema; what the files do not hold is marked (``input_ids`` -1,
``f_baseline`` and ``residual`` NaN, ``attention`` an empty ``[0, 0, n, n]`` without an
attention file). Formats and what the store gets: docs/tree.md, "Importing the 2021 code's
outputs". Nothing here prints.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..data.readers import json_problem
from ..engine.provenance import libraries
from ..errors import DataError

SOURCE = "import-2021"
SPECIAL = {"[CLS]", "[SEP]", "[PAD]", "<s>", "</s>", "<pad>"}
SEPARATORS = {"[SEP]", "</s>"}


@dataclass
class ImportReport:
    out: str
    index: int
    n_tokens: int
    layers: int
    heads: int
    created: bool
    already: bool  # the example was in the store already: nothing written
    labels: list[str]
    label_mapping: str


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _lines(path: Path):
    if not path.exists():
        raise DataError(f"{path}: no such file")
    if path.is_dir():
        raise DataError(f"{path} is a directory, not a file")
    try:
        with open(path, encoding="utf-8") as f:
            yield from enumerate(f, start=1)
    except UnicodeDecodeError:
        raise DataError(f"{path} is not a UTF-8 text file") from None


def read_matrices(path: str | Path) -> np.ndarray:
    """A 2021 attribution (or attention) file -> [layers, heads, n, n] float64."""
    path = Path(path)
    layers: list[np.ndarray] = []
    for k, line in _lines(path):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except (ValueError, RecursionError) as exc:
            raise DataError(f"{path}, line {k}: not JSON ({json_problem(exc)}); "
                            "expected one [heads][n][n] list per line") from None
        try:
            arr = np.asarray(value, dtype=np.float64)
        except (ValueError, TypeError):
            raise DataError(f"{path}, line {k}: not a [heads][n][n] list of numbers (ragged or not numeric)") from None
        if arr.ndim != 3 or arr.shape[1] != arr.shape[2] or arr.shape[0] == 0 or arr.shape[1] == 0:
            raise DataError(f"{path}, line {k}: expected a [heads][n][n] list, got shape {list(arr.shape)}")
        if layers and arr.shape != layers[0].shape:
            raise DataError(f"{path}, line {k}: shape {list(arr.shape)} differs from the first line's {list(layers[0].shape)}")
        if not np.isfinite(arr).all():
            raise DataError(f"{path}, line {k}: holds NaN or infinite values")
        layers.append(arr)
    if not layers:
        raise DataError(f"{path} holds no layers (expected one [heads][n][n] JSON list per line)")
    return np.stack(layers)


def read_tokens_file(path: str | Path) -> list[dict]:
    """A 2021 tokens file (a JSON list, one object, or JSON lines) -> its entries."""
    path = Path(path)
    text = "".join(line for _, line in _lines(path))
    try:
        data = json.loads(text)
        entries = data if isinstance(data, list) else [data]
    except (ValueError, RecursionError):
        entries = []
        for k, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                entries.append(json.loads(line))
            except (ValueError, RecursionError) as exc:
                raise DataError(
                    f"{path}, line {k}: not JSON ({json_problem(exc)}); expected the 2021 tokens file "
                    "(a JSON list of {index, tokens, pred, golden}) or JSON lines"
                ) from None
    if not entries:
        raise DataError(f"{path} holds no examples")
    for k, e in enumerate(entries):
        if not isinstance(e, dict) or not isinstance(e.get("tokens"), list) \
                or not all(isinstance(t, str) for t in e["tokens"]):
            raise DataError(f"{path}, entry {k}: expected an object with \"tokens\" (a list of strings)")
        if "index" in e and not isinstance(e["index"], int):
            raise DataError(f"{path}, entry {k}: \"index\" is not an integer")
    return entries


def pick_entry(entries: list[dict], tokens_path: Path, attr_path: Path, example: int | None) -> tuple[int, int]:
    """(example index, position in the tokens file) of the example the attribution is for."""
    if example is None:
        m = re.search(r"exp(\d+)", attr_path.stem)
        if m:
            example = int(m.group(1))
        elif len(entries) == 1:
            example = int(entries[0].get("index", 0))
        else:
            raise DataError(
                f"cannot tell which of the {len(entries)} examples in {tokens_path} {attr_path.name} is for: "
                "give --example"
            )
    indices = [int(e.get("index", k)) for k, e in enumerate(entries)]
    if example not in indices:
        raise DataError(
            f"{tokens_path} has no example with index {example} (it holds {len(indices)} examples: "
            f"{min(indices)}..{max(indices)})"
        )
    return example, indices.index(example)


def _logits(entry: dict) -> np.ndarray | None:
    value = entry.get("pred_logits")
    if value is None:
        return None
    try:
        arr = np.asarray(value, dtype=np.float64).reshape(-1)
    except (ValueError, TypeError):
        return None
    return arr if arr.size else None


def infer_labels(entries: list[dict], labels: Sequence[str] | None = None) -> tuple[list[str], str]:
    """The label names in the model's order, and how they were found ("given" or "inferred").

    Inferred: each predicted name sits at the argmax of its example's logits; names only
    seen as gold labels fill the free places in sorted order; places nobody fills are
    called label_K. Without logits the order is the sorted names."""
    names = {str(e[k]) for e in entries for k in ("pred", "golden") if e.get(k) is not None}
    if labels is not None:
        labels = [str(x) for x in labels]
        missing = sorted(names - set(labels))
        if missing:
            raise DataError(f"label '{missing[0]}' of the tokens file is not among --labels ({', '.join(labels)})")
        return labels, "given"
    sizes = {a.size for e in entries if (a := _logits(e)) is not None}
    if len(sizes) > 1:
        raise DataError(f"the tokens file's pred_logits have different lengths ({sorted(sizes)}): give --labels")
    if not sizes:
        return sorted(names), "inferred"
    size = sizes.pop()
    place: dict[str, int] = {}
    for e in entries:
        a = _logits(e)
        if a is None or e.get("pred") is None:
            continue
        name, k = str(e["pred"]), int(np.argmax(a))
        if place.get(name, k) != k or any(other != name and j == k for other, j in place.items()):
            raise DataError(
                f"the tokens file's predicted labels do not match the argmax of pred_logits consistently "
                f"('{name}'): give --labels"
            )
        place[name] = k
    out: list[str | None] = [None] * size
    for name, k in place.items():
        out[k] = name
    free = [k for k in range(size) if out[k] is None]
    rest = sorted(names - set(place))
    if len(rest) > len(free):
        raise DataError(f"the tokens file names {len(names)} labels but its logits have {size}: give --labels")
    for k, name in zip(free, rest):
        out[k] = name
    return [name if name is not None else f"label_{k}" for k, name in enumerate(out)], "inferred"


def segment_ids_of(tokens: Sequence[str]) -> np.ndarray:
    """0 for the first segment, 1 for the second, -1 for special tokens (BERT's layout)."""
    seg, current = [], 0
    for t in tokens:
        if t in SPECIAL:
            seg.append(-1)
            if t in SEPARATORS:
                current += 1
        else:
            seg.append(min(current, 1))
    return np.asarray(seg, dtype=np.int8)


def _text(tokens: Sequence[str], seg: np.ndarray, which: int) -> str:
    words = [t for t, s in zip(tokens, seg) if s == which]
    return " ".join(words).replace(" ##", "")


def _softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max())
    return z / z.sum()


def import_2021(attr_path: str | Path, tokens_path: str | Path, out: str | Path, model: str | None = None,
                example: int | None = None, labels: Sequence[str] | None = None,
                attention_path: str | Path | None = None, command: list[str] | None = None,
                store_dtype: str = "float32") -> ImportReport:
    """Write one example of a 2021 run into the store ``out`` (created, or extended when it
    was made from the same tokens file and model name)."""
    from ..engine.results import ExampleScore
    from ..store import StoreWriter

    attr_path, tokens_path = Path(attr_path), Path(tokens_path)
    attribution = read_matrices(attr_path)
    entries = read_tokens_file(tokens_path)
    index, pos = pick_entry(entries, tokens_path, attr_path, example)
    if index < 0:
        raise DataError(f"example index {index} is negative")
    entry = entries[pos]
    tokens = list(entry["tokens"])
    n_layers, n_heads, n = attribution.shape[:3]
    if n != len(tokens):
        raise DataError(
            f"{attr_path.name} is {n} x {n} per head but example {index} of {tokens_path.name} has "
            f"{len(tokens)} tokens: are they from the same example?"
        )
    attention = np.zeros((0, 0, n, n), dtype=np.float32)
    if attention_path is not None:
        attention_path = Path(attention_path)
        attention = read_matrices(attention_path)
        if attention.shape[1:] != (n_heads, n, n):
            raise DataError(
                f"{attention_path.name} has shape {list(attention.shape)} per file but the attribution has "
                f"{n_heads} heads of {n} x {n}"
            )
    names, how = infer_labels(entries, labels)
    logits = _logits(entry)
    if logits is None or logits.size != len(names):
        logits = np.full(len(names), np.nan)
    known = logits.size > 0 and bool(np.isfinite(logits).all())
    probs = _softmax(logits) if known else np.full(len(names), np.nan)
    pred = names.index(str(entry["pred"])) if entry.get("pred") is not None else (
        int(np.argmax(logits)) if known else -1)
    gold = names.index(str(entry["golden"])) if entry.get("golden") is not None else -1
    seg = segment_ids_of(tokens)
    attr_sha = sha256_file(attr_path)
    meta = {
        "source": SOURCE,
        "attribution_file": attr_path.name,
        "attribution_sha256": attr_sha,
        "tokens_file": tokens_path.name,
        "tokens_entry": pos,
        "pred_label": entry.get("pred"),
        "gold_label": entry.get("golden"),
    }
    if attention_path is not None:
        meta["attention_file"] = attention_path.name
        meta["attention_sha256"] = sha256_file(attention_path)
    score = ExampleScore(
        index=index,
        tokens=tokens,
        input_ids=np.full(n, -1, dtype=np.int64),
        segment_ids=seg,
        gold=gold,
        pred=pred,
        target=pred,  # the 2021 code attributes the predicted class
        logits=logits,
        probs=probs,
        layers=list(range(n_layers)),
        attribution=attribution,
        attention=attention,
        head_max=attribution.reshape(n_layers, n_heads, -1).max(axis=-1),
        f_full=float(probs[pred]) if pred >= 0 and known else float("nan"),
        f_baseline=np.full(n_layers, np.nan),
        residual=np.full(n_layers, np.nan),
        kernel=SOURCE,
        meta=meta,
        text_a=_text(tokens, seg, 0),
        text_b=_text(tokens, seg, 1) if (seg == 1).any() else None,
    )
    tokens_sha = sha256_file(tokens_path)
    model = model or "unknown"
    options = {"format": "attattr-2021 JSON lines", "model": model, "layers": n_layers, "heads": n_heads,
               "labels": names}
    fingerprint = {
        "weights_sha256": "",
        "options": options,
        "data": f"{SOURCE}:{tokens_path.name}",
        "data_sha256": tokens_sha,
    }
    command = list(command) if command is not None else []
    provenance = {
        "model": model,
        "model_path": "",
        "model_source": SOURCE,
        **dict.fromkeys(("model_revision", "weights_sha256", "model_type", "model_class"), ""),  # not in the files
        "num_layers": n_layers,
        "num_heads": n_heads,
        "label_names": names,
        "task": "",
        "task_labels": names,
        "label_mapping": how,
        "data": str(tokens_path),
        "data_sha256": tokens_sha,
        "options": options,
        "libraries": libraries(frameworks=False),
        "seed": -1,
        "device": "",
        "dtype": "float32",
        "kernel": SOURCE,
        "command": command,
        "store_dtype": store_dtype,
    }
    out = Path(out)
    with StoreWriter(out, fingerprint, provenance, store_dtype=store_dtype) as writer:
        already = index in writer.done
        writer.log_run({"command": command, "kernel": SOURCE, "device": "", "imported": attr_path.name,
                        "attribution_sha256": attr_sha, "index": index, "already_present": already})
        if not already:
            writer.write(score)
        created = writer.created
    return ImportReport(out=str(out), index=index, n_tokens=n, layers=n_layers, heads=n_heads, created=created,
                        already=already, labels=names, label_mapping=how)

