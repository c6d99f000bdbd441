"""One attention family's datasets in a store group: what they are, how they are written and
read back (validated). The writer, the reader and a generation's steps (store/steps.py) all
go through here (docs/store.md)."""

from __future__ import annotations

import h5py
import numpy as np

from .. import convergence
from ..errors import StoreError
from .compress import FILTERS, start, write_maps
from .schema import AXES


# what each numeric dataset of an example (or a family) must be: dtype kinds and dimensions
ARRAYS = {"input_ids": ("iu", 1), "segment_ids": ("iu", 1), "logits": ("f", 1), "probs": ("f", 1),
           "layers": ("iu", 1), "head_max": ("f", None), "f_baseline": ("f", 1), "residual": ("f", 1),
           "attribution": ("f", 4), "attention": ("f", 4), "attention_mean": ("f", 3), "head_sum": ("f", 3),
           "topk_index": ("iu", 4), "topk_value": ("f", 3), "nodes": ("iu", 1), "error_estimate": ("f", 1),
           "node_cap_hit": ("biu", 1), "convergence": ("iu", 1), "key_sum": ("f", 2),
          "read_sum": ("f", 2)}
MAPS = ("attribution", "attention", "head_sum", "attention_mean")  # chunked one layer per chunk, compressed
# the datasets that hold one value per layer
PER_LAYER = ("f_baseline", "residual", "nodes", "error_estimate", "node_cap_hit", "convergence")


def damaged(path, where: str, what: str) -> StoreError:
    """The one-line error of a store whose content is not what attattr wrote."""
    return StoreError(f"{path} is damaged: in {where}, {what}; it was left as it is (score it again into a new store)")


def checked(path, group, key: str, where: str, layers: int | None = None):
    """``group[key]`` checked against the schema (ARRAYS): a dataset, of a numeric dtype of
    the right kind, with the right number of dimensions (and one value per layer where
    ``layers`` is given); a StoreError naming the store, the example and the dataset if not."""
    node = group.get(key)
    if not isinstance(node, h5py.Dataset):
        raise damaged(path, where, f"'{key}' is a {'group' if isinstance(node, h5py.Group) else type(node).__name__},"
                                   " not a dataset")
    kinds, ndim = ARRAYS[key]
    if node.dtype.kind not in kinds:
        raise damaged(path, where, f"'{key}' holds {node.dtype} values, not numbers of the kind attattr writes")
    if ndim is not None and node.ndim != ndim and node.size:  # an empty array (keep none) has any shape
        raise damaged(path, where, f"'{key}' has {node.ndim} dimensions, not {ndim}")
    if layers is not None and key in PER_LAYER and node.shape[0] != layers:
        raise damaged(path, where, f"'{key}' has {node.shape[0]} values for {layers} layers")
    return node


def read_convergence(path, group, where: str, layers: int):
    """(states [layers] uint8, tol or None) of a family's ``convergence`` dataset, validated:
    a dataset of integers, one per layer, each a known state; ``tol`` a finite number > 0.
    No dataset (a store before schema 1.3): every layer UNCHECKED."""
    if "convergence" not in group:
        return np.full(layers, convergence.UNCHECKED, np.uint8), None
    ds = checked(path, group, "convergence", where, layers)
    states = ds[()]
    unknown = sorted({int(s) for s in np.ravel(states)} - set(convergence.NAMES))
    if unknown:
        raise damaged(path, where, f"'convergence' holds unknown states {unknown[:5]}")
    tol = None
    if "tol" in ds.attrs:
        tol = ds.attrs["tol"]
        if isinstance(tol, (np.ndarray, np.generic)) and tol.size == 1:
            tol = tol.item()
        if isinstance(tol, bytes):
            tol = tol.decode("utf-8", "replace")
        if isinstance(tol, (bool, np.bool_)) or not isinstance(tol, (int, float, np.integer, np.floating)) \
                or not np.isfinite(float(tol)) or float(tol) <= 0:
            raise damaged(path, where, f"the convergence tolerance is {tol!r}, not a finite number > 0")
        tol = float(tol)
    return states.astype(np.uint8), tol


def self_maps_info(head_max) -> dict:
    """The ``families`` entry of an example in the 1.0 shape: the self family, its maps kept."""
    heads = int(np.shape(head_max)[1]) if np.ndim(head_max) == 2 else 0
    return {"keep": "maps", "heads": heads, "query": "input", "key": "input"}


def family_arrays(fs) -> dict:
    """The datasets of one FamilyScore, by name (absent entries: None)."""
    attention = fs.attention
    return dict(
        layers=fs.layers, attribution=fs.attribution,
        attention=attention if attention is not None and attention.ndim == 4 else None,
        attention_mean=attention if attention is not None and attention.ndim == 3 else None,
        head_sum=fs.head_sum if fs.keep != "maps" else None,
        head_max=fs.head_max, f_baseline=fs.f_baseline, residual=fs.residual,
        topk_index=fs.topk_index, topk_value=fs.topk_value, nodes=getattr(fs, "nodes", None),
        error_estimate=getattr(fs, "error", None),
        node_cap_hit=None if getattr(fs, "capped", None) is None else np.asarray(fs.capped, np.uint8),
        convergence=None if getattr(fs, "status", None) is None else np.asarray(fs.status, np.uint8),
        convergence_tol=getattr(fs, "status_tol", None),
        key_sum=getattr(fs, "key_sum", None),  # schema 1.5 (keep sources)
        read_sum=getattr(fs, "read_sum", None))  # schema 1.6 (keep sources: the rows that read the passages)


def write_family(g, arrays: dict, held: list, store_dtype: str = "float32") -> None:
    """One family's datasets (:func:`family_arrays`; absent entries: None) into group ``g``;
    every dataset made is added to ``held`` (the writer closes them after its flush, so that
    a failed write raises there). Maps are stored as ``store_dtype``."""
    def dataset(name, **kw):
        ds = g.create_dataset(name, **kw)
        held.append(ds)
        return ds

    maps = {name: np.ascontiguousarray(arrays[name], dtype=store_dtype) for name in MAPS if arrays.get(name) is not None}
    started = {name: start(arr) for name, arr in maps.items()}  # every map's chunks share the cores
    for name, value in arrays.items():
        if value is None or name == "convergence_tol":  # an attribute of convergence, not a dataset
            continue
        arr = np.asarray(value)
        if name == "layers":
            ds = dataset(name, data=arr.astype(np.int32))
        elif name in maps:  # a chunk per layer, filtered on every core (store/compress.py)
            ds = write_maps(dataset, name, maps[name], started[name])
        elif name == "topk_index":
            ds = dataset(name, data=arr.astype(np.int32), **(FILTERS if arr.size else {}))
        elif name in ("head_max", "topk_value", "key_sum", "read_sum"):
            ds = dataset(name, data=arr.astype(np.float32))
        else:
            ds = dataset(name, data=arr)
        if name == "convergence" and arrays.get("convergence_tol") is not None:
            ds.attrs["tol"] = float(arrays["convergence_tol"])  # the tolerance the states were judged at
        for i, label in enumerate(AXES.get(name, ())):
            if i < arr.ndim:
                ds.dims[i].label = label


def read_family(path, fg, where: str, arrays: bool = True) -> dict:
    """The datasets of the family group ``fg``, each checked against the schema first
    (:func:`checked`, :func:`read_convergence`: a damaged group is a StoreError naming
    ``where``); the maps only with ``arrays`` (else None). Keys as StoredExample's fields
    (``attention`` holds the head mean where only that is kept)."""
    n_layers = checked(path, fg, "layers", where).shape[0]
    for key in ARRAYS:
        if key in fg:
            checked(path, fg, key, where, n_layers)
    states, tol = read_convergence(path, fg, where, n_layers)

    def arr(key, big=True):
        if key not in fg:
            return None
        return fg[key][()] if (arrays or not big) else None

    attention = arr("attention")
    return dict(
        layers=[int(x) for x in fg["layers"][()]], attribution=arr("attribution"),
        attention=attention if attention is not None else arr("attention_mean"),
        head_max=fg["head_max"][()], f_baseline=fg["f_baseline"][()], residual=fg["residual"][()],
        head_sum=arr("head_sum"), topk_index=arr("topk_index"), topk_value=arr("topk_value"),
        nodes=arr("nodes", big=False), error_estimate=arr("error_estimate", big=False),
        node_cap_hit=None if "node_cap_hit" not in fg else fg["node_cap_hit"][()].astype(bool),
        convergence=states, convergence_tol=tol, key_sum=arr("key_sum", big=False),
        read_sum=arr("read_sum", big=False))
