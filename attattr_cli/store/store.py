"""Writing, reading, validating and merging attattr HDF5 stores.

Crash safety: each example is written into a hidden group ``examples/.partial-N``,
marked complete, then renamed to ``examples/N`` and the file flushed. A reader lists only
complete, renamed groups, and a writer deletes leftover partial groups when it opens the
store, so an interrupted run never leaves a half-written example that reads as whole.
Several processes can each write their own shard (same fingerprint, disjoint examples);
:func:`merge` joins them.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import h5py
import numpy as np

from .. import __version__
from ..errors import StoreError
from .schema import (
    AXES,
    EXAMPLES,
    FAMILIES,
    PARTIAL_PREFIX,
    PROVENANCE,
    SCHEMA_MAJOR,
    SHARD_EXAMPLES,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    STORE_DTYPES,
    example_name,
)

_STR = h5py.string_dtype("utf-8")


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _attr(obj, name, default=None):
    value = obj.attrs.get(name, default)
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def _open(path: Path, mode: str) -> h5py.File:
    try:
        return h5py.File(path, mode)
    except BlockingIOError as exc:
        raise StoreError(f"{path} is open for writing in another process") from exc
    except OSError as exc:
        text = str(exc)
        if "lock" in text.lower():
            raise StoreError(f"{path} is open for writing in another process") from exc
        if mode == "r" and not path.exists():
            raise StoreError(f"no such store: {path}") from exc
        first = text.splitlines()[0] if text else type(exc).__name__
        raise StoreError(f"{path} is not a readable HDF5 store ({first}); it was left as it is") from exc


def _check_schema(f: h5py.File, path: Path) -> None:
    name = _attr(f, "schema")
    if name != SCHEMA_NAME:
        raise StoreError(f"{path} is an HDF5 file but not an attattr store (schema attribute: {name!r})")
    version = str(_attr(f, "schema_version", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise StoreError(f"{path} has an unreadable schema version {version!r}") from None
    if major > SCHEMA_MAJOR:
        raise StoreError(
            f"{path} has store schema {version}, newer than this attattr {__version__} reads "
            f"({SCHEMA_MAJOR}.x): upgrade attattr"
        )
    if EXAMPLES not in f or PROVENANCE not in f:
        raise StoreError(f"{path} is damaged: it lacks the '{EXAMPLES}' or '{PROVENANCE}' group")


def _fingerprint_mismatch(path: Path, there: dict, here: dict) -> str | None:
    """One line saying how two fingerprints differ, or None if they agree."""
    if there == here:
        return None
    if there.get("weights_sha256") != here.get("weights_sha256"):
        return (
            f"{path} was made with another model (weights sha256 {str(there.get('weights_sha256'))[:12]}…;"
            f" this run's model: {str(here.get('weights_sha256'))[:12]}…): use another --out"
        )
    if there.get("data") != here.get("data"):
        return f"{path} was made from other data ({there.get('data')}; this run: {here.get('data')}): use another --out"
    to, ho = there.get("options", {}), here.get("options", {})
    for key in sorted(set(to) | set(ho)):
        if to.get(key) != ho.get(key):
            return (
                f"{path} was made with other options ({key}={to.get(key)!r} there, {ho.get(key)!r} here):"
                " use the same options or another --out"
            )
    for key in sorted(set(there) | set(here)):
        if there.get(key) != here.get(key):
            return f"{path} was made with another {key} ({there.get(key)!r} there, {here.get(key)!r} here)"
    return None


class _OpenFile:
    """An open h5py file in ``self.f``; closes on ``close()`` or leaving a ``with`` block."""

    f: h5py.File

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()


class StoreWriter(_OpenFile):
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
            raise StoreError(f"--out {self.path} is a directory")
        if not self.path.parent.exists():
            raise StoreError(f"--out {self.path}: the folder {self.path.parent} does not exist")
        existed = self.path.exists() and self.path.stat().st_size > 0
        if existed:
            if not h5py.is_hdf5(self.path):
                raise StoreError(f"{self.path} exists and is not an HDF5 store; it was left as it is")
            self.f = _open(self.path, "r+")
            try:
                _check_schema(self.f, self.path)
                there = json.loads(_attr(self.f, "fingerprint", "{}"))
                problem = _fingerprint_mismatch(self.path, there, fingerprint)
                if problem:
                    raise StoreError(problem)
                for name in list(self.f[EXAMPLES]):
                    if name.startswith(PARTIAL_PREFIX):
                        del self.f[EXAMPLES][name]
            except BaseException:
                self.f.close()
                raise
        else:
            self.f = _open(self.path, "w")
            f = self.f
            f.attrs["schema"] = SCHEMA_NAME
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["attattr_version"] = __version__
            f.attrs["created"] = _now()
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
        runs = json.loads(_attr(prov, "runs", "[]"))
        runs.append(dict(info, started=_now()))
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
        g.create_dataset("tokens", data=np.array(score.tokens, dtype=object), dtype=_STR)
        g.create_dataset("input_ids", data=score.input_ids)
        g.create_dataset("segment_ids", data=score.segment_ids)
        g.create_dataset("logits", data=score.logits)
        g.create_dataset("probs", data=score.probs)
        if getattr(score, "decoder_tokens", None) is not None:
            g.create_dataset("decoder_tokens", data=np.array(score.decoder_tokens, dtype=object), dtype=_STR)
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
        a["written"] = _now()
        a["complete"] = True
        self.f.flush()
        examples.move(tmp, final)
        self.f.flush()
        self.done.add(score.index)


@dataclass
class StoredExample:
    index: int
    tokens: list[str]
    input_ids: np.ndarray
    segment_ids: np.ndarray
    gold: int
    pred: int
    target: int
    logits: np.ndarray
    probs: np.ndarray
    layers: list[int]
    attribution: np.ndarray
    attention: np.ndarray
    head_max: np.ndarray
    f_full: float
    f_baseline: np.ndarray
    residual: np.ndarray
    kernel: str
    truncated: bool
    text_a: str
    text_b: str | None
    meta: dict
    # schema 1.1
    family: str = "self"
    families: list = None  # every family this example holds
    keep: str = "maps"  # maps | sum | none
    head_sum: np.ndarray | None = None  # [layer, query, key]: the maps summed over heads
    topk_index: np.ndarray | None = None  # [layer, head, k, 2] (query, key)
    topk_value: np.ndarray | None = None  # [layer, head, k]
    key_tokens: list | None = None  # tokens of the key axis (= tokens unless family is cross)
    decoder_tokens: list | None = None
    # schema 1.2: per layer, the integration nodes used, the estimated max |error of Attr| / max |Attr|,
    # and (--tol) whether the node cap was hit before the tolerance
    nodes: np.ndarray | None = None
    error_estimate: np.ndarray | None = None
    node_cap_hit: np.ndarray | None = None

    def summed(self) -> np.ndarray | None:
        """[layer, query, key]: the head sum, from the maps or as stored."""
        if self.head_sum is not None:
            return self.head_sum
        if self.attribution is not None and np.ndim(self.attribution) == 4:
            return np.asarray(self.attribution).sum(axis=1)
        return None


def _strings(ds) -> list[str]:
    return [t.decode() if isinstance(t, bytes) else t for t in ds[()]]


class Store(_OpenFile):
    """Read-only view of a store. Use as a context manager or call ``close()``."""

    def __init__(self, path: str | os.PathLike, _mode: str = "r"):
        self.path = Path(path)
        if not self.path.exists():
            raise StoreError(f"no such store: {self.path}")
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory, not a store")
        if _mode != "r" and not h5py.is_hdf5(self.path):  # never let h5py touch a file it cannot read
            raise StoreError(f"{self.path} is not a readable HDF5 store; it was left as it is")
        self.f = _open(self.path, _mode)
        try:
            _check_schema(self.f, self.path)
        except BaseException:
            self.f.close()
            raise

    @property
    def schema_version(self) -> str:
        return str(_attr(self.f, "schema_version"))

    @property
    def fingerprint(self) -> dict:
        return json.loads(_attr(self.f, "fingerprint", "{}"))

    @property
    def root_attrs(self) -> dict[str, Any]:
        return {k: _attr(self.f, k) for k in self.f.attrs}

    @property
    def provenance(self) -> dict[str, Any]:
        prov = self.f[PROVENANCE]
        out = {}
        for key in prov.attrs:
            value = _attr(prov, key)
            if isinstance(value, str) and value[:1] in "[{":
                try:
                    value = json.loads(value)
                except json.JSONDecodeError:
                    pass
            out[key] = value
        return out

    def indices(self) -> list[int]:
        g = self.f[EXAMPLES]
        return sorted(
            int(name) for name in g
            if not name.startswith(PARTIAL_PREFIX) and bool(g[name].attrs.get("complete", False))
        )

    def __len__(self) -> int:
        return len(self.indices())

    def __contains__(self, index: int) -> bool:
        return example_name(index) in self.f[EXAMPLES]

    def families_of(self, index: int) -> dict[str, dict]:
        """{family: {keep, heads, query, key}} of one example (1.0 stores: self only)."""
        g = self._group(index)
        info = _attr(g, "families")
        if info:
            return json.loads(info)
        heads = int(g["head_max"].shape[1]) if "head_max" in g and g["head_max"].ndim == 2 else 0
        return {"self": {"keep": "maps", "heads": heads, "query": "input", "key": "input"}}

    def families(self) -> list[str]:
        idx = self.indices()
        return list(self.families_of(idx[0])) if idx else []

    def _group(self, index: int):
        name = example_name(index)
        if name not in self.f[EXAMPLES]:
            have = self.indices()
            span = f"{have[0]}..{have[-1]}" if have else "none"
            raise StoreError(f"example {index} is not in {self.path} (it holds {len(have)} examples: {span})")
        return self.f[EXAMPLES][name]

    def get(self, index: int, arrays: bool = True, family: str | None = None) -> StoredExample:
        """One example; ``family`` picks the attention family (default: the first one the
        example holds: ``self``, or ``encoder`` for encoder-decoder models)."""
        g = self._group(index)
        a = g.attrs
        fams = self.families_of(index)
        family = family or next(iter(fams))
        if family not in fams:
            raise StoreError(f"example {index} in {self.path} has no attention family '{family}'; it has: {', '.join(fams)}")
        fg = g if family == "self" else g[FAMILIES][family]
        finfo = fams[family]

        def arr(key, big=True):
            if key not in fg:
                return None
            return fg[key][()] if (arrays or not big) else None

        tokens = _strings(g["tokens"])
        decoder_tokens = _strings(g["decoder_tokens"]) if "decoder_tokens" in g else None
        segments = g["segment_ids"][()]
        query_tokens = decoder_tokens if finfo.get("query") == "decoder" and decoder_tokens is not None else tokens
        key_tokens = decoder_tokens if finfo.get("key") == "decoder" and decoder_tokens is not None else tokens
        if query_tokens is not tokens:  # the decoder input is the input shifted right by one
            segments = np.concatenate([[-1], segments[:-1]]).astype(segments.dtype)
        attention = arr("attention")
        if attention is None:
            attention = arr("attention_mean")
        return StoredExample(
            index=int(_attr(g, "index")),
            tokens=query_tokens,
            input_ids=g["input_ids"][()],
            segment_ids=segments,
            gold=int(_attr(g, "gold")),
            pred=int(_attr(g, "pred")),
            target=int(_attr(g, "target")),
            logits=g["logits"][()],
            probs=g["probs"][()],
            layers=[int(x) for x in fg["layers"][()]],
            attribution=arr("attribution"),
            attention=attention,
            head_max=fg["head_max"][()],
            f_full=float(_attr(g, "f_full")),
            f_baseline=fg["f_baseline"][()],
            residual=fg["residual"][()],
            kernel=str(_attr(g, "kernel")),
            truncated=bool(a.get("truncated", False)),
            text_a=str(_attr(g, "text_a", "")),
            text_b=str(_attr(g, "text_b")) if bool(a.get("has_text_b", False)) else None,
            meta=json.loads(_attr(g, "meta", "{}")),
            family=family,
            families=list(fams),
            keep=str(finfo.get("keep", "maps")),
            head_sum=arr("head_sum"),
            topk_index=arr("topk_index"),
            topk_value=arr("topk_value"),
            key_tokens=key_tokens,
            decoder_tokens=decoder_tokens,
            nodes=arr("nodes", big=False),
            error_estimate=arr("error_estimate", big=False),
            node_cap_hit=None if "node_cap_hit" not in fg else fg["node_cap_hit"][()].astype(bool),
        )

    def __iter__(self) -> Iterable[StoredExample]:
        for i in self.indices():
            yield self.get(i)

    def summary(self) -> dict[str, Any]:
        """What ``attattr info`` shows."""
        idx = self.indices()
        lengths, correct, golds, resid = [], 0, 0, []
        for i in idx:
            e = self.get(i, arrays=False)
            lengths.append(len(e.tokens))
            if e.gold >= 0:
                golds += 1
                correct += int(e.gold == e.pred)
            resid.append(np.abs(e.residual))
        prov = self.provenance
        out = {
            "path": str(self.path),
            "size_bytes": self.path.stat().st_size,
            **{k: v for k, v in self.root_attrs.items() if k != "fingerprint"},
            "examples": len(idx),
            "first_index": idx[0] if idx else None,
            "last_index": idx[-1] if idx else None,
            "tokens_min": int(min(lengths)) if lengths else None,
            "tokens_mean": float(np.mean(lengths)) if lengths else None,
            "tokens_max": int(max(lengths)) if lengths else None,
            "accuracy": (correct / golds) if golds else None,
            "with_gold": golds,
            "mean_abs_residual_per_layer": np.mean(resid, axis=0).tolist() if resid else None,
            "families": self._family_summary(idx),
            "provenance": prov,
        }
        return out

    def _family_summary(self, idx: list[int]) -> dict:
        """{family: {layers, heads, keep, query, key, mean_abs_residual}} over the examples."""
        out: dict = {}
        for i in idx:
            for name, info in self.families_of(i).items():
                e = self.get(i, arrays=False, family=name)
                d = out.setdefault(name, {"layers": e.layers, "heads": info.get("heads"), "keep": set(),
                                          "query": info.get("query"), "key": info.get("key"), "_r": [],
                                          "top_k": None})
                d["keep"].add(info.get("keep"))
                d["_r"].extend(np.abs(e.residual).tolist())
                for key, value in (("_n", e.nodes), ("_e", e.error_estimate), ("_c", e.node_cap_hit)):
                    d.setdefault(key, []).extend([] if value is None else np.asarray(value).tolist())
                g = self._group(i)
                fg = g if name == "self" else g[FAMILIES][name]
                if "topk_value" in fg:
                    d["top_k"] = int(fg["topk_value"].shape[-1])
        for d in out.values():
            d["keep"] = ",".join(sorted(d["keep"]))
            r = d.pop("_r")
            d["mean_abs_residual"] = float(np.mean(r)) if r else None
            nodes, est, cap = d.pop("_n"), [x for x in d.pop("_e") if np.isfinite(x)], d.pop("_c")
            d["nodes_mean"] = float(np.mean(nodes)) if nodes else None
            d["nodes_max"] = int(max(nodes)) if nodes else None
            d["error_estimate_max"] = float(max(est)) if est else None
            d["error_estimate_median"] = float(np.median(est)) if est else None
            d["node_cap_hits"] = int(sum(cap)) if cap else (0 if nodes else None)
            d["example_layers"] = len(r)
        return out


def _merge_mismatch(a: Path, b: Path, fa: dict, fb: dict, verb: str = "with") -> str | None:
    """One line saying why store ``b`` cannot be merged with (or into) ``a``, or None."""
    if fa == fb:
        return None
    head = f"cannot merge {b.name} {verb} {a.name}: they were made"
    if fa.get("weights_sha256") != fb.get("weights_sha256"):
        return (f"{head} with other models (weights sha256 {str(fb.get('weights_sha256'))[:12]}… and "
                f"{str(fa.get('weights_sha256'))[:12]}…)")
    if fa.get("data") != fb.get("data") or fa.get("data_sha256") != fb.get("data_sha256"):
        return (f"{head} from other data ({fb.get('data')}, sha256 {str(fb.get('data_sha256'))[:12]}… and "
                f"{fa.get('data')}, sha256 {str(fa.get('data_sha256'))[:12]}…)")
    oa, ob = fa.get("options", {}), fb.get("options", {})
    diff = [k for k in sorted(set(oa) | set(ob)) if oa.get(k) != ob.get(k)]
    if diff:
        return (f"{head} with other options ({', '.join(f'{k}={ob.get(k)}' for k in diff)} and "
                f"{', '.join(f'{k}={oa.get(k)}' for k in diff)})")
    diff = [k for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)]
    return f"{head} with another {', '.join(diff)} ({', '.join(f'{fb.get(k)}' for k in diff)} and {', '.join(f'{fa.get(k)}' for k in diff)})"


# an HDF5 attribute in the default (earliest) file format holds at most 64 KiB
_ATTR_LIMIT = 60_000


def _fit_attr(items: list[dict], shrink) -> str:
    """JSON of ``items``, condensed by ``shrink`` when hundreds of shards would overflow an attribute."""
    text = json.dumps(items)
    if len(text) > _ATTR_LIMIT:
        text = json.dumps(shrink(items))
    while len(text) > _ATTR_LIMIT and len(items) > 1:  # last resort: keep the newest
        items = items[len(items) // 2:]
        text = json.dumps(shrink(items))
    return text


def _group_runs(runs: list[dict]) -> list[dict]:
    """One entry per launch instead of one per rank: the runs of a torchrun launch share
    command and world size; counts are summed, ranks and hosts listed."""
    out: list[dict] = []
    index: dict[str, dict] = {}
    for run in runs:
        if "rank" not in run:
            out.append(run)
            continue
        key = json.dumps([run.get("command"), run.get("world_size"), run.get("kernel")])
        g = index.get(key)
        if g is None:
            g = {k: v for k, v in run.items() if k not in ("rank", "host", "shard", "requested", "to_score", "device")}
            g.update(ranks=0, hosts=[], requested=0, to_score=0, devices=[])
            index[key] = g
            out.append(g)
        g["ranks"] += 1
        g["requested"] += int(run.get("requested", 0))
        g["to_score"] += int(run.get("to_score", 0))
        g["started"] = min(g.get("started", run.get("started", "")), run.get("started", ""))
        for field_, value in (("hosts", run.get("host")), ("devices", run.get("device"))):
            if value is not None and value not in g[field_]:
                g[field_].append(value)
    return out


def _group_merges(merges: list[dict]) -> list[dict]:
    return [dict({k: v for k, v in m.items() if k != "shards"}, shards=len(m.get("shards", []))) for m in merges]


def _span(indices: list[int], limit: int = 8) -> str:
    shown = ", ".join(str(i) for i in indices[:limit])
    return shown + (f", … ({len(indices)} in all)" if len(indices) > limit else "")


@dataclass
class ShardCheck:
    """What :func:`inspect_shards` found: problems that stop a merge, and notes that do not."""

    fingerprint: dict
    indices: dict[str, list[int]]  # shard path -> complete examples in it
    overlap: list[int]  # examples present in more than one shard
    incomplete: dict[str, list[int]]  # shard path -> assigned examples it lacks
    missing_ranks: list[str]  # "k/n" of distributed shards not given

    def problems(self) -> list[str]:
        out = []
        for path, lacking in self.incomplete.items():
            out.append(f"{Path(path).name} lacks {len(lacking)} of the examples its process was given ({_span(lacking)}):"
                       " it was interrupted; run the same command again to finish it")
        if self.missing_ranks:
            out.append(f"the shards of {', '.join(self.missing_ranks)} are missing"
                       " (copy them here from the machines that wrote them)")
        return out

    def notes(self) -> list[str]:
        if not self.overlap:
            return []
        return [f"{len(self.overlap)} example{'s' if len(self.overlap) != 1 else ''} ({_span(self.overlap)})"
                " in more than one shard; each is taken once, from the first shard that holds it"]


def inspect_shards(shards: list[str | os.PathLike]) -> ShardCheck:
    """Check that shards can be merged: same fingerprint (else StoreError), and report
    overlapping examples, shards that lack examples they were given, and missing ranks."""
    if not shards:
        raise StoreError("merge needs at least one shard")
    paths = [Path(p) for p in shards]
    seen_paths: set[Path] = set()
    for p in paths:
        if p.resolve() in seen_paths:
            raise StoreError(f"{p} is given twice")
        seen_paths.add(p.resolve())
    base_fp = None
    indices: dict[str, list[int]] = {}
    incomplete: dict[str, list[int]] = {}
    ranks: dict[int, set[int]] = {}
    owner: dict[int, str] = {}
    overlap: set[int] = set()
    for p in paths:
        with Store(p) as r:
            fp = r.fingerprint
            if base_fp is None:
                base_fp = fp
            else:
                problem = _merge_mismatch(paths[0], p, base_fp, fp)
                if problem:
                    raise StoreError(problem)
            have = r.indices()
            indices[str(p)] = have
            for i in have:
                if i in owner:
                    overlap.add(i)
                else:
                    owner[i] = str(p)
            shard = str(_attr(r.f, "shard", "") or "")
            if shard and SHARD_EXAMPLES in r.f:
                lacking = sorted(set(int(x) for x in r.f[SHARD_EXAMPLES][()]) - set(have))
                if lacking:
                    incomplete[str(p)] = lacking
            if "/" in shard:
                k, n = (int(x) for x in shard.split("/"))
                ranks.setdefault(n, set()).add(k)
    missing = [f"rank {k} of {n}" for n, ks in sorted(ranks.items()) for k in range(n) if k not in ks]
    return ShardCheck(base_fp, indices, sorted(overlap), incomplete, missing)


def merge(shards: list[str | os.PathLike], out: str | os.PathLike, partial: bool = True) -> dict:
    """Join shards written with the same fingerprint into ``out`` (created, or extended).

    Examples already in ``out`` are kept; an example present in two shards is taken once.
    A new ``out`` is written under a temporary name and renamed when complete; an existing
    one is extended example by example (each written whole or not at all). With
    ``partial=False``, shards of a distributed run that lack examples they were given, or
    missing ranks, are refused (see :func:`inspect_shards`). The merged store's provenance
    keeps every shard's runs and a "merges" entry. Returns {"added": n, "skipped": n}.
    """
    check = inspect_shards(shards)
    if not partial and check.problems():
        raise StoreError("cannot merge: " + "; ".join(check.problems()) + " (or merge what is there with --partial)")
    out = Path(out)
    if out.is_dir():
        raise StoreError(f"--out {out} is a directory")
    if not out.parent.exists():
        raise StoreError(f"--out {out}: the folder {out.parent} does not exist")
    if any(out.resolve() == Path(p).resolve() for p in shards):
        raise StoreError(f"--out {out} is one of the shards: choose another file")
    readers = [Store(p) for p in shards]
    tmp_path: Path | None = None
    try:
        base = readers[0]
        if out.exists() and out.stat().st_size > 0:
            target = _open(out, "r+")
            try:
                _check_schema(target, out)
                problem = _merge_mismatch(out, base.path, json.loads(_attr(target, "fingerprint", "{}")),
                                          base.fingerprint, verb="into")
                if problem:
                    raise StoreError(problem)
            except BaseException:
                target.close()
                raise
        else:
            tmp_path = out.with_name(f".{out.name}.merging-{os.getpid()}")
            target = _open(tmp_path, "w")
            for k, v in base.f.attrs.items():
                target.attrs[k] = v
            target.attrs["shard"] = ""
            target.attrs["created"] = _now()
            target.create_group(EXAMPLES)
            base.f.copy(base.f[PROVENANCE], target, PROVENANCE)
            target[PROVENANCE].attrs["runs"] = "[]"
        added = skipped = 0
        try:
            dest = target[EXAMPLES]
            for name in list(dest):
                if name.startswith(PARTIAL_PREFIX):
                    del dest[name]
            prov = target[PROVENANCE]
            runs = json.loads(_attr(prov, "runs", "[]"))
            entry = {"time": _now(), "shards": []}
            for r in readers:
                shard_added = 0
                for i in r.indices():
                    name = example_name(i)
                    if name in dest:
                        skipped += 1
                        continue
                    tmp = PARTIAL_PREFIX + name
                    r.f.copy(r.f[EXAMPLES][name], dest, tmp)
                    target.flush()
                    dest.move(tmp, name)
                    added += 1
                    shard_added += 1
                shard = str(_attr(r.f, "shard", "") or "")
                for run in json.loads(_attr(r.f[PROVENANCE], "runs", "[]")):
                    run = dict(run, shard=shard or r.path.name)
                    if run not in runs:
                        runs.append(run)
                entry["shards"].append({"file": r.path.name, "shard": shard, "examples": len(r.indices()),
                                        "added": shard_added})
            entry.update(added=added, skipped=skipped)
            merges = json.loads(_attr(prov, "merges", "[]"))
            merges.append(entry)
            prov.attrs["runs"] = _fit_attr(runs, _group_runs)
            prov.attrs["merges"] = _fit_attr(merges, _group_merges)
            target.flush()
        finally:
            target.close()
        if tmp_path is not None:
            os.replace(tmp_path, out)
            tmp_path = None
        return {"added": added, "skipped": skipped}
    finally:
        for r in readers:
            r.close()
        if tmp_path is not None and tmp_path.exists():
            tmp_path.unlink()
