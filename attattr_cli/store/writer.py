"""Writing examples into a store, creating it or resuming it (crash-safe: see opening.py).

Several processes can each write their own shard (same fingerprint, disjoint examples);
``merging.merge`` joins them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np

from .. import __version__
from ..errors import StoreError
from .fingerprint import fingerprint_difference
from .opening import UTF8, OpenFile, check_schema, open_file, read_attr, utc_now
from .schema import (
    AXES,
    EXAMPLES,
    FAMILIES,
    PARTIAL_PREFIX,
    PROVENANCE,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    SHARD_EXAMPLES,
    STORE_DTYPES,
    example_name,
)


_HINTS = {"options": "use the same options or another output store"}


def check_fingerprint(path: Path, there: dict, here: dict) -> None:
    """Refuse to add to the store at ``path`` (fingerprint ``there``) a run with fingerprint ``here``."""
    difference = fingerprint_difference(there, here)
    if difference is not None:
        hint = _HINTS.get(difference.kind, "use another output store")
        raise StoreError(f"{path} was made {difference.explain('there', 'here')}: {hint}")


class StoreWriter(OpenFile):
    """Appends examples to a store, creating it or resuming it."""

    def __init__(self, path: str | os.PathLike, fingerprint: dict, provenance: dict,
                 store_dtype: str = "float32", shard: str = "", assigned: list[int] | None = None):
        """``shard`` ("k/n") and ``assigned`` (the indices that process k of n was given) mark a
        shard of a distributed run; the assignment lets a merge tell a finished shard from an
        interrupted one."""
        if store_dtype not in STORE_DTYPES:
            raise StoreError(f"unknown store dtype '{store_dtype}'; available: {', '.join(STORE_DTYPES)}")
        self.path = Path(path)
        self.store_dtype = np.float16 if store_dtype == "float16" else np.float32
        fingerprint = dict(fingerprint, store_dtype=store_dtype)
        self.fingerprint = fingerprint
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory, not a store")
        if not self.path.parent.exists():
            raise StoreError(f"cannot create {self.path}: the folder {self.path.parent} does not exist")
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            if not h5py.is_hdf5(self.path):
                raise StoreError(f"{self.path} exists and is not an HDF5 store; it was left as it is")
            self.f = open_file(self.path, "r+")
            try:
                check_schema(self.f, self.path)
                there = json.loads(read_attr(self.f, "fingerprint", "{}"))
                check_fingerprint(self.path, there, fingerprint)
                for name in list(self.f[EXAMPLES]):
                    if name.startswith(PARTIAL_PREFIX):
                        del self.f[EXAMPLES][name]
            except BaseException:
                self.f.close()
                raise
        else:
            self.f = open_file(self.path, "w")
            f = self.f
            f.attrs["schema"] = SCHEMA_NAME
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["attattr_version"] = __version__
            f.attrs["created"] = utc_now()
            f.attrs["fingerprint"] = json.dumps(fingerprint, sort_keys=True)
            f.attrs["shard"] = shard
            f.create_group(EXAMPLES)
            prov = f.create_group(PROVENANCE)
            for key, value in provenance.items():
                prov.attrs[key] = value if isinstance(value, (str, int, float)) else json.dumps(value)
            prov.attrs["runs"] = "[]"
            f.flush()
        if assigned is not None:
            if SHARD_EXAMPLES in self.f:
                del self.f[SHARD_EXAMPLES]
            self.f.create_dataset(SHARD_EXAMPLES, data=np.asarray(sorted(assigned), dtype=np.int64))
            self.f.attrs["shard"] = shard
            self.f.flush()
        self.done = {int(n) for n in self.f[EXAMPLES] if not n.startswith(PARTIAL_PREFIX)}
        self.created = not existed

    def log_run(self, info: dict) -> None:
        prov = self.f[PROVENANCE]
        runs = json.loads(read_attr(prov, "runs", "[]"))
        runs.append(dict(info, started=utc_now()))
        prov.attrs["runs"] = json.dumps(runs)
        self.f.flush()

    def _write_family(self, g, arrays: dict) -> None:
        """One family's datasets into group ``g`` (absent entries: None)."""
        big = dict(compression="gzip", compression_opts=4, shuffle=True)
        for name, value in arrays.items():
            if value is None:
                continue
            arr = np.asarray(value)
            if name == "layers":
                g.create_dataset(name, data=arr.astype(np.int32))
            elif name in ("attribution", "attention"):
                chunks = (1, *arr.shape[1:]) if arr.size else None
                g.create_dataset(name, data=arr.astype(self.store_dtype), chunks=chunks, **(big if arr.size else {}))
            elif name in ("head_sum", "attention_mean"):
                chunks = (1, *arr.shape[1:]) if arr.size else None
                g.create_dataset(name, data=arr.astype(self.store_dtype), chunks=chunks, **(big if arr.size else {}))
            elif name == "topk_index":
                g.create_dataset(name, data=arr.astype(np.int32), **(big if arr.size else {}))
            elif name in ("head_max", "topk_value"):
                g.create_dataset(name, data=arr.astype(np.float32))
            else:
                g.create_dataset(name, data=arr)
            for i, label in enumerate(AXES.get(name, ())):
                if i < arr.ndim:
                    g[name].dims[i].label = label

    def write(self, score) -> None:
        """Write one ``ExampleScore`` atomically (see module docstring)."""
        examples = self.f[EXAMPLES]
        final = example_name(score.index)
        if final in examples:
            return
        tmp = PARTIAL_PREFIX + final
        if tmp in examples:
            del examples[tmp]
        g = examples.create_group(tmp)
        n = len(score.tokens)
        g.create_dataset("tokens", data=np.array(score.tokens, dtype=object), dtype=UTF8)
        g.create_dataset("input_ids", data=score.input_ids)
        g.create_dataset("segment_ids", data=score.segment_ids)
        g.create_dataset("logits", data=score.logits)
        g.create_dataset("probs", data=score.probs)
        if getattr(score, "decoder_tokens", None) is not None:
            g.create_dataset("decoder_tokens", data=np.array(score.decoder_tokens, dtype=object), dtype=UTF8)
            g.create_dataset("decoder_input_ids", data=score.decoder_input_ids)
        families = getattr(score, "families", None) or {}
        info = {}
        if not families:  # an ExampleScore built by hand in the 1.0 shape
            self._write_family(g, dict(
                layers=score.layers, attribution=score.attribution, attention=score.attention,
                head_max=score.head_max, f_baseline=score.f_baseline, residual=score.residual))
            info["self"] = {"keep": "maps", "heads": int(np.shape(score.head_max)[1]) if np.ndim(score.head_max) == 2 else 0,
                            "query": "input", "key": "input"}
        for name, fs in families.items():
            where = g if name == "self" else g.require_group(FAMILIES).create_group(name)
            attention = fs.attention
            self._write_family(where, dict(
                layers=fs.layers, attribution=fs.attribution,
                attention=attention if attention is not None and attention.ndim == 4 else None,
                attention_mean=attention if attention is not None and attention.ndim == 3 else None,
                head_sum=fs.head_sum if fs.keep != "maps" else None,
                head_max=fs.head_max, f_baseline=fs.f_baseline, residual=fs.residual,
                topk_index=fs.topk_index, topk_value=fs.topk_value, nodes=getattr(fs, "nodes", None),
                error_estimate=getattr(fs, "error", None),
                node_cap_hit=None if getattr(fs, "capped", None) is None else np.asarray(fs.capped, np.uint8)))
            info[name] = {"keep": fs.keep, "heads": int(fs.heads), "query": fs.query_side, "key": fs.key_side}
        a = g.attrs
        a["families"] = json.dumps(info)
        a["step_batch"] = int(getattr(score, "step_batch", 0) or 0)
        a = g.attrs
        a["index"] = score.index
        a["gold"] = score.gold
        a["pred"] = score.pred
        a["target"] = score.target
        a["f_full"] = score.f_full
        a["n_tokens"] = n
        a["kernel"] = score.kernel
        a["truncated"] = bool(score.truncated)
        a["text_a"] = score.text_a
        a["text_b"] = score.text_b if score.text_b is not None else ""
        a["has_text_b"] = score.text_b is not None
        a["meta"] = json.dumps(score.meta, sort_keys=True)
        a["written"] = utc_now()
        a["complete"] = True
        self.f.flush()
        examples.move(tmp, final)
        self.f.flush()
        self.done.add(score.index)
