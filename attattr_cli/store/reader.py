"""Reading a store: ``Store`` (read-only view) and ``StoredExample`` (one example, one family)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, NamedTuple

import h5py
import numpy as np

from .. import convergence
from ..errors import OptionError, StoreError, first_line
from .opening import OpenFile, check_schema, open_file, open_padded, read_attr, stored_below
from .schema import EXAMPLES, FAMILIES, PARTIAL_PREFIX, PROVENANCE, example_name
from .family import ARRAYS, checked, damaged, read_convergence, read_family, self_maps_info
from .fingerprint import check_fingerprint
from .steps import read_steps

UNCONVERGED_LISTED = 100  # info --json lists at most this many unconverged (example, layer) per family


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
    # schema 1.2, per layer: nodes used, estimated max |error of Attr| / max |Attr|, node cap hit (docs/store.md)
    nodes: np.ndarray | None = None
    error_estimate: np.ndarray | None = None
    node_cap_hit: np.ndarray | None = None
    # schema 1.3: per layer, the convergence state (convergence.py; UNCHECKED for older stores), judged at the tol
    convergence: np.ndarray | None = None
    convergence_tol: float | None = None
    nonfinite: list = None  # parts holding NaN or inf ("logits", "attribution", ...); [] when none
    label_names: list | None = None  # the class names (Store.get gives the store's), for the names below
    # schema 1.4: a generation's steps, one StoredExample per token, of its prefix (store/steps.py); None otherwise
    steps: list | None = None
    output: str | None = None  # what F is of the target: prob, logprob or logit (the store's option)
    # schema 1.5: keep sources: [layer, key], the attribution summed over heads and queries
    key_sum: np.ndarray | None = None
    # schema 1.6: keep sources: [layer, key], summed over heads and the query rows after the last passage
    read_sum: np.ndarray | None = None

    # one set of names for every reader (Store.get, open_store()[i], score()): the fields above
    # as stored (pred, gold, target: class indices; probs), and these
    @property
    def converged(self) -> bool:
        """Whether every scored layer's integral converged (a store before schema 1.3: True, unchecked)."""
        return not convergence.unconverged(self.convergence).any()

    @property
    def unconverged_layers(self) -> dict[int, str]:
        """{layer: why} for the scored layers whose integral did not converge."""
        return convergence.unconverged_layers(self.layers, self.convergence)

    def _name(self, i) -> str | None:
        if i is None or int(i) < 0:
            return None
        names = self.label_names or []
        return names[int(i)] if int(i) < len(names) else str(int(i))

    def _lm(self) -> dict | None:
        lm = self.meta.get("lm") if isinstance(self.meta, dict) else None
        return lm if isinstance(lm, dict) else None

    def _token(self, piece) -> str:
        """A token of this example as a reader sees it (labels.py: decoded, spaces marked)."""
        from ..labels import example_style, token_label

        style = example_style(self)
        return token_label(str(piece), None if style == "text" else style)

    @property
    def prediction(self) -> str | None:
        """The predicted class's name; for a language model the predicted next token, decoded
        (``␣Paris``; docs/views.md, "Token labels")."""
        lm = self._lm()
        if lm is not None and self.pred is not None and int(self.pred) >= 0:
            return self._token(lm.get("predicted_token", self.pred))
        return self._name(self.pred)

    @property
    def prediction_id(self) -> int:
        """The predicted class's index; for a language model the predicted token's id (-1: none)."""
        return int(self.pred)

    @property
    def target_id(self) -> int:
        """The attributed class's index; for a language model the (first) target token's id."""
        return int(self.target)

    @property
    def probabilities(self) -> np.ndarray:
        """The class probabilities (numpy), in ``label_names`` order."""
        return np.asarray(self.probs)

    @property
    def gold_label(self) -> str | None:
        """The gold class's name, or None when unknown."""
        return self._name(self.gold)

    @property
    def target_label(self) -> str | None:
        """The name of the class whose probability was attributed; for a language model the
        target token(s), space-separated (the view's header shows the same)."""
        lm = self._lm()
        if lm is not None and lm.get("target_tokens"):
            from ..labels import example_style, text_of, visible

            style = example_style(self)
            return visible(text_of([str(t) for t in lm["target_tokens"]], None if style == "text" else style))
        return self._name(self.target)

    @property
    def foil_label(self) -> str | None:
        """The foil (``--foil``: F is the target's output minus the foil's), or None."""
        lm = self._lm()
        if lm is not None:
            return None if lm.get("foil_token") is None else self._token(lm["foil_token"])
        foil = self.meta.get("foil") if isinstance(self.meta, dict) else None
        if isinstance(foil, dict):
            return self._name(foil.get("index")) if self.label_names else str(foil.get("label"))
        return None

    @property
    def attributed(self) -> str:
        """What was attributed, by name and value: "attributed F = p(␣Paris) − p(␣London) = 0.76 · ..."."""
        from ..labels import attributed

        return attributed(self, self.label_names)["line"]

    @property
    def text(self):
        """The input: a string, or a (first, second) pair."""
        return self.text_a if self.text_b is None else (self.text_a, self.text_b)

    def top(self, k: int = 10) -> list[Interaction]:
        """The ``k`` strongest interactions (largest attribution), strongest first, as
        :class:`Interaction` rows (layer, head, query, key, query_token, key_token, value)."""
        if k < 1:
            raise OptionError(f"k must be at least 1, got {k}")
        from ..labels import example_labels

        queries, keys = example_labels(self)  # the tokens as a reader sees them (labels.py)
        layers = list(self.layers)
        if self.attribution is not None and np.ndim(self.attribution) == 4:
            a, by_head = np.asarray(self.attribution), True
        elif self.head_sum is not None:
            a, by_head = np.asarray(self.head_sum)[:, None], False
        elif self.topk_index is not None:
            rows = []
            idx, val = np.asarray(self.topk_index), np.asarray(self.topk_value)
            for li, h, j in np.ndindex(idx.shape[:3]):
                q, kk = int(idx[li, h, j, 0]), int(idx[li, h, j, 1])
                rows.append(Interaction(layers[li], h, q, kk, queries[q], keys[kk], float(val[li, h, j])))
            return sorted(rows, key=lambda r: -r.value)[:k]
        else:
            raise StoreError(f"example {self.index} keeps no attribution maps (scored with keep={self.keep!r} and no top_k)")
        flat = a.reshape(-1)
        k = min(k, flat.size)
        best = np.argpartition(-flat, k - 1)[:k]
        best = best[np.argsort(-flat[best], kind="stable")]
        out = []
        for b in best:
            li, h, q, kk = np.unravel_index(int(b), a.shape)
            out.append(Interaction(layers[li], int(h) if by_head else -1, int(q), int(kk), queries[q], keys[kk],
                                   float(flat[b])))
        return out

    def token_importance(self) -> np.ndarray:
        """Per (key) token: the attribution summed over layers, heads and queries."""
        s = self.summed()
        if s is None and self.key_sum is not None:  # keep sources: the key sums are what is kept
            return np.asarray(self.key_sum, np.float64).sum(axis=0)
        if s is None:
            raise StoreError(f"example {self.index} keeps no attribution maps (scored with keep='none')")
        return np.asarray(s, np.float64).sum(axis=(0, 1))

    def summed(self) -> np.ndarray | None:
        """[layer, query, key]: the head sum, from the maps or as stored."""
        if self.head_sum is not None:
            return self.head_sum
        if self.attribution is not None and np.ndim(self.attribution) == 4:
            return np.asarray(self.attribution).sum(axis=1)
        return None


class Interaction(NamedTuple):
    """One attribution entry: ``layer``, ``head`` (-1 when only the head sum is kept), the
    ``query`` and ``key`` positions and tokens (as a reader sees them: labels.py; the
    tokenizer's pieces are ``example.tokens[query]``), and its ``value``."""

    layer: int
    head: int
    query: int
    key: int
    query_token: str
    key_token: str
    value: float


def _strings(ds) -> list[str]:
    return [t.decode() if isinstance(t, bytes) else t for t in ds[()]]


_RETRIES = 6  # a reader retries this many times when a read fails while a writer changes the file
_SETTLE = 0.25  # a failed read waits this long for a writer to change the file before it is an error


def _file_state(path: Path) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_size, st.st_mtime_ns


def _changes(path: Path, state: tuple[int, int] | None) -> bool:
    """Whether the file's size or modification time moves away from ``state`` within
    ``_SETTLE`` seconds: a writer at work (read again), or a file at rest (the failure stands)."""
    end = time.monotonic() + _SETTLE
    while True:
        if _file_state(path) != state:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


def _retrying(method):
    """Run a read again on a freshly opened file when it fails while the file changes (a writer
    at work; docs/store.md, "Readers during a write"); a file at rest fails after ``_SETTLE``."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        if self._mode != "r" or self._depth:
            return method(self, *args, **kwargs)
        for attempt in range(_RETRIES):
            self._depth += 1
            try:
                return method(self, *args, **kwargs)
            except (OSError, RuntimeError, KeyError, ValueError, TypeError) as exc:
                if attempt == _RETRIES - 1 or not _changes(self.path, self._state):
                    if self.cut_short:
                        raise StoreError(f"{self.path} is damaged: the file is shorter than HDF5 recorded and"
                                         f" cannot be read ({first_line(exc)})") from exc
                    raise StoreError(f"{self.path} could not be read ({first_line(exc)})") from exc
            finally:
                self._depth -= 1
            self._reopen()

    return wrapper


class Store(OpenFile):
    """Read-only view of a store. Use as a context manager or call ``close()``.

    Opened without HDF5's lock, so it can watch a store being written (docs/store.md, "Readers
    during a write"); a store cut short by a failed write is read as far as it goes
    (``cut_short`` is then True). A read that fails raises StoreError."""

    def __init__(self, path: str | os.PathLike, _mode: str = "r"):
        self.path = Path(path)
        self._mode = _mode
        self._depth = 0
        self.cut_at: int | None = None
        if not self.path.exists():
            raise StoreError(f"no such store: {self.path}")
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory, not a store")
        if _mode != "r" and not h5py.is_hdf5(self.path):  # never let h5py touch a file it cannot read
            raise StoreError(f"{self.path} is not a readable HDF5 store; it was left as it is")
        self.f = self._open()
        try:
            self._check()
        except BaseException:
            self.f.close()
            raise

    def _open(self) -> h5py.File:
        if self._mode != "r":
            return open_file(self.path, self._mode)
        for attempt in range(_RETRIES):
            self._state = _file_state(self.path)
            try:
                return open_file(self.path, "r", locking=False)
            except StoreError as exc:
                if getattr(exc, "truncated", None) is None:
                    raise
                cut = exc.truncated
            # shorter than recorded: a writer in the middle of a flush, or cut short for good
            if not _changes(self.path, self._state):
                break
        self.cut_at, recorded = cut
        return open_padded(self.path, recorded)

    @_retrying
    def _check(self) -> None:
        check_schema(self.f, self.path)

    def _reopen(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.f.close()
        self.f = self._open()

    @property
    def cut_short(self) -> bool:
        return self.cut_at is not None

    @property
    def schema_version(self) -> str:
        return str(read_attr(self.f, "schema_version"))

    @property
    def fingerprint(self) -> dict:
        return json.loads(read_attr(self.f, "fingerprint", "{}"))

    @property
    def root_attrs(self) -> dict[str, Any]:
        return {k: read_attr(self.f, k) for k in self.f.attrs}

    @property
    @_retrying
    def provenance(self) -> dict[str, Any]:
        prov = self.f[PROVENANCE]
        out = {}
        for key in prov.attrs:
            value = read_attr(prov, key)
            if isinstance(value, str) and value[:1] in "[{":
                with contextlib.suppress(json.JSONDecodeError):
                    value = json.loads(value)
            out[key] = value
        return out

    def num_layers(self, family: str = "self") -> int | None:
        """How many layers the model has (in ``family``, for encoder-decoder models), from the
        provenance; None if the store does not say (e.g. imported from the 2021 code)."""
        prov = self.provenance
        fams = prov.get("families")
        if isinstance(fams, dict) and isinstance(fams.get(family), dict):
            n = fams[family].get("layers")
        else:
            n = prov.get("num_layers")
        return n if isinstance(n, int) and not isinstance(n, bool) else None

    @_retrying
    def indices(self, finite: bool = False) -> list[int]:
        """The complete examples, in order; ``finite=True`` leaves out those flagged
        ``nonfinite`` (see :meth:`flagged`)."""
        g = self.f[EXAMPLES]
        return sorted(
            int(name) for name in g
            if not name.startswith(PARTIAL_PREFIX) and bool(g[name].attrs.get("complete", False))
            and (self.cut_at is None or stored_below(g[name], self.cut_at))
            and not (finite and read_attr(g[name], "nonfinite", ""))
        )

    @_retrying
    def flagged(self) -> list[int]:
        """The complete examples whose scores hold NaN or inf (attribute ``nonfinite``):
        every analysis skips them."""
        g = self.f[EXAMPLES]
        return [i for i in self.indices() if read_attr(g[example_name(i)], "nonfinite", "")]

    def finite(self, indices) -> tuple[list[int], int]:
        """``indices`` without the flagged examples, and how many were left out."""
        bad = set(self.flagged())
        kept = [i for i in indices if i not in bad]
        return kept, len(indices) - len(kept)

    @functools.cached_property
    def _label_names(self) -> list:
        """The class names of the store's provenance (read once)."""
        return list(self.provenance.get("label_names") or [])

    @functools.cached_property
    def _output(self) -> str | None:
        """The store's ``output`` option (prob, logprob or logit; read once)."""
        opts = self.provenance.get("options")
        out = opts.get("output") if isinstance(opts, dict) else None
        return out if isinstance(out, str) else None

    def unconverged(self, indices) -> list[int]:
        """Those of ``indices`` with a layer (of any family) whose integral the store calls not
        converged (dataset ``convergence``, schema 1.3; older stores: none are judged)."""
        out = []
        for i in indices:
            for family in self.families_of(i):
                fg = self._family_group(i, family)
                layers = checked(self.path, fg, "layers", f"example {i}").shape[0]
                where = f"example {i}" + ("" if family == "self" else f" ({family})")
                states, _ = read_convergence(self.path, fg, where, layers)
                if convergence.unconverged(states).any():
                    out.append(i)
                    break
        return out

    def _family_group(self, index: int, family: str):
        g = self._group(index)
        if family == "self":
            return g
        if FAMILIES not in g or not isinstance(g[FAMILIES], h5py.Group) or family not in g[FAMILIES]:
            raise damaged(self.path, f"example {index}", f"lacks its attention family '{family}'")
        return g[FAMILIES][family]

    def __len__(self) -> int:
        return len(self.indices())

    def __contains__(self, index: int) -> bool:
        return example_name(index) in self.f[EXAMPLES]

    @_retrying
    def families_of(self, index: int) -> dict[str, dict]:
        """{family: {keep, heads, query, key}} of one example (1.0 stores: self only)."""
        g = self._group(index)
        info = read_attr(g, "families")
        if info:
            return json.loads(info)
        return {"self": self_maps_info(g["head_max"] if "head_max" in g else None)}

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

    @_retrying
    def get(self, index: int, arrays: bool = True, family: str | None = None) -> StoredExample:
        """One example; ``family`` picks the attention family (default: the first one the
        example holds: ``self``, or ``encoder`` for encoder-decoder models)."""
        g = self._group(index)
        a = g.attrs
        fams = self.families_of(index)
        family = family or next(iter(fams))
        if family not in fams:
            raise StoreError(f"example {index} in {self.path} has no attention family '{family}'; it has: {', '.join(fams)}")
        fg = self._family_group(index, family)
        finfo = fams[family]
        where = f"example {index}" + ("" if family == "self" else f" ({family})")
        if g is not fg:
            for key in ARRAYS:  # every numeric dataset read below, checked before it is read
                if key in g:
                    checked(self.path, g, key, where)
        fam = read_family(self.path, fg, where, arrays)  # checked there (store/family.py)
        tokens = _strings(g["tokens"])
        decoder_tokens = _strings(g["decoder_tokens"]) if "decoder_tokens" in g else None
        segments = g["segment_ids"][()]
        query_tokens = decoder_tokens if finfo.get("query") == "decoder" and decoder_tokens is not None else tokens
        key_tokens = decoder_tokens if finfo.get("key") == "decoder" and decoder_tokens is not None else tokens
        if query_tokens is not tokens:  # the decoder input is the input shifted right by one
            segments = np.concatenate([[-1], segments[:-1]]).astype(segments.dtype)
        example = StoredExample(
            index=int(read_attr(g, "index")),
            tokens=query_tokens,
            input_ids=g["input_ids"][()],
            segment_ids=segments,
            gold=int(read_attr(g, "gold")),
            pred=int(read_attr(g, "pred")),
            target=int(read_attr(g, "target")),
            logits=g["logits"][()],
            probs=g["probs"][()],
            f_full=float(read_attr(g, "f_full")),
            kernel=str(read_attr(g, "kernel")),
            truncated=bool(a.get("truncated", False)),
            text_a=str(read_attr(g, "text_a", "")),
            text_b=str(read_attr(g, "text_b")) if bool(a.get("has_text_b", False)) else None,
            meta=json.loads(read_attr(g, "meta", "{}")),
            family=family,
            families=list(fams),
            keep=str(finfo.get("keep", "maps")),
            key_tokens=key_tokens,
            decoder_tokens=decoder_tokens,
            **fam,
            label_names=list(self._label_names),
            output=self._output,
            nonfinite=[p for p in str(read_attr(g, "nonfinite", "") or "").split(",") if p],
        )
        if family == "self":
            example.steps = read_steps(self.path, example, g, arrays)
        return example

    def __iter__(self) -> Iterable[StoredExample]:
        for i in self.indices():
            yield self.get(i)

    @_retrying
    def summary(self) -> dict[str, Any]:
        """What ``attattr info`` shows (accuracy and residuals over the examples not flagged
        ``nonfinite``, listed in ``nonfinite_examples``)."""
        idx = self.indices()
        lengths, correct, golds, resid, gens = [], 0, 0, [], []
        for i in idx:
            e = self.get(i, arrays=False)
            lengths.append(len(e.tokens))
            if e.steps:
                gens.append(e)
            if e.nonfinite:  # left out of accuracy and residuals
                continue
            if e.gold >= 0:
                golds += 1
                correct += int(e.gold == e.pred)
            resid.append(np.abs(e.residual))
        prov = self.provenance
        out = {
            "path": str(self.path),
            "size_bytes": self.path.stat().st_size,
            "cut_short": self.cut_short,
            **{k: v for k, v in self.root_attrs.items() if k != "fingerprint"},
            "examples": len(idx),
            "nonfinite_examples": self.flagged(),
            "first_index": idx[0] if idx else None,
            "last_index": idx[-1] if idx else None,
            "tokens_min": int(min(lengths)) if lengths else None,
            "tokens_mean": float(np.mean(lengths)) if lengths else None,
            "tokens_max": int(max(lengths)) if lengths else None,
            "accuracy": (correct / golds) if golds else None,
            "with_gold": golds,
            "mean_abs_residual_per_layer": np.mean(resid, axis=0).tolist() if resid else None,
            "families": self._family_summary(idx),
            "generations": generation_summary(gens),  # schema 1.4: per-step results (store/steps.py)
            "provenance": prov,
        }
        gen = out["generations"]
        if gen and "self" in out["families"]:  # a generation's integrals are its steps': one count, per step and layer
            d = out["families"]["self"]
            d.update(convergence=gen["step_convergence"], unconverged=gen["step_layers_unconverged"],
                     unconverged_at=gen["step_unconverged_at"], counted="step-layers")
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
                if not e.nonfinite:
                    d["_r"].extend(np.abs(e.residual).tolist())
                for key, value in (("_n", e.nodes), ("_e", e.error_estimate), ("_c", e.node_cap_hit),
                                   ("_s", e.convergence)):
                    d.setdefault(key, []).extend([] if value is None else np.asarray(value).tolist())
                d.setdefault("unconverged_at", []).extend(
                    {"example": int(i), "layer": layer, "state": why}
                    for layer, why in convergence.unconverged_layers(e.layers, e.convergence).items())
                if e.convergence_tol is not None:
                    d["convergence_tol"] = e.convergence_tol
                fg = self._family_group(i, name)
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
            states = d.pop("_s")
            d["convergence"] = convergence.counts(states)  # {state name: example-layers}
            d["unconverged"] = int(convergence.unconverged(states).sum())
            d["unconverged_at"] = d.get("unconverged_at", [])[:UNCONVERGED_LISTED]  # the first ones; "unconverged" counts all
            d["example_layers"] = len(r)
        return out


def already_done(path: str | os.PathLike, fingerprint: dict, store_dtype: str = "float32") -> set[int] | None:
    """The examples a store at ``path`` already holds, read without opening it for writing;
    None when there is no store there or it cannot be read (the writer then reports why).
    A store made otherwise is refused here (``StoreError``), as the writer would."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return None
    try:
        store = Store(path)
    except StoreError:
        return None
    with store:
        check_fingerprint(path, store.fingerprint, dict(fingerprint, store_dtype=store_dtype))
        return set(store.indices())


def generation_summary(examples) -> dict | None:
    """What ``attattr info`` says of the generations among ``examples`` (StoredExamples read
    with their steps): how many, their steps, the largest per-step completeness residual
    and the per-step convergence (None when no example is a generation)."""
    gens = [e for e in examples if e.steps]
    if not gens:
        return None
    resid, states, unconverged = [], [], []
    for e in gens:
        for t, st in enumerate(e.steps):
            resid.extend(np.abs(st.residual).tolist())
            states.extend(np.asarray(st.convergence).tolist() if st.convergence is not None else [])
            unconverged.extend({"example": int(e.index), "step": t, "layer": layer, "state": why}
                               for layer, why in convergence.unconverged_layers(st.layers, st.convergence).items())
    counts = [len(e.steps) for e in gens]
    return {"examples": len(gens), "steps_total": int(sum(counts)), "steps_max": int(max(counts)),
            "step_abs_residual_max": float(max(resid)) if resid else None,
            "step_abs_residual_mean": float(np.mean(resid)) if resid else None,
            "step_convergence": convergence.counts(states), "step_layers_unconverged": len(unconverged),
            "step_unconverged_at": unconverged[:UNCONVERGED_LISTED]}
