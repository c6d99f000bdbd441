"""Token importance in the store: one schema for every method (docs/store.md).

    /examples/NNNNNNNN/token_importance/<method>    [n] float32, axis "token"
        attrs: method, description, params (JSON: what defines the numbers), written

An addition under schema 1.x that old readers ignore (they never look inside
``token_importance``); ``merge`` copies it with its example. A vector is written as
``.partial-<method>`` and renamed when complete, so a crash never leaves a half-written
vector that reads as whole. A vector already there with other params is refused, never
overwritten.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys

import h5py
import numpy as np

from ..errors import StoreError, first_line
from .schema import EXAMPLES, PARTIAL_PREFIX, example_name
from .opening import utc_now
from .reader import Store

GROUP = "token_importance"


def _group(f: h5py.File, index: int):
    name = example_name(index)
    if name not in f[EXAMPLES]:
        raise StoreError(f"example {index} is not in the store")
    return f[EXAMPLES][name]


def read_token_importance(store: Store, index: int) -> dict[str, np.ndarray]:
    """{method: [n] float32} stored for one example (empty when none)."""
    g = _group(store.f, index)
    if GROUP not in g:
        return {}
    return {m: g[GROUP][m][()] for m in g[GROUP] if not m.startswith(PARTIAL_PREFIX)}


def token_importance_params(store: Store, index: int) -> dict[str, dict]:
    g = _group(store.f, index)
    if GROUP not in g:
        return {}
    return {m: json.loads(g[GROUP][m].attrs.get("params", "{}")) for m in g[GROUP]
            if not m.startswith(PARTIAL_PREFIX)}


class TokenImportanceStore(Store):
    """A store opened for reading examples and adding token importance vectors."""

    def __init__(self, path: str | os.PathLike):
        super().__init__(path, _mode="r+")

    def stored(self, index: int, method: str, params: dict) -> np.ndarray | None:
        """The stored vector when it was made with ``params``; None when absent.

        Raises StoreError when it is there with other params."""
        g = _group(self.f, index)
        if GROUP not in g or method not in g[GROUP]:
            return None
        ds = g[GROUP][method]
        there = json.loads(ds.attrs.get("params", "{}"))
        if there != params:
            diff = sorted(k for k in set(there) | set(params) if there.get(k) != params.get(k))
            key = diff[0] if diff else "params"
            raise StoreError(
                f"{self.path} holds '{method}' token importance made with other settings "
                f"({key}={there.get(key)!r} there, {params.get(key)!r} here): use the same settings or a copy of the store"
            )
        return ds[()]

    def write(self, index: int, method: str, values: np.ndarray, params: dict, description: str = "") -> None:
        g = _group(self.f, index)
        n = int(g.attrs.get("n_tokens", len(g["tokens"])))
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (n,):
            raise StoreError(f"token importance '{method}' of example {index} has shape {values.shape}, expected ({n},)")
        held = []
        caught: list[BaseException] = []
        hook = sys.unraisablehook
        sys.unraisablehook = lambda unraisable: caught.append(unraisable.exc_value)
        failed = False
        try:
            ti = g.require_group(GROUP)
            held.append(ti)
            if method in ti:
                return
            tmp = PARTIAL_PREFIX + method
            if tmp in ti:
                del ti[tmp]
            ds = ti.create_dataset(tmp, data=values)
            held.append(ds)
            ds.dims[0].label = "token"
            ds.attrs["method"] = method
            ds.attrs["description"] = description
            ds.attrs["params"] = json.dumps(params, sort_keys=True)
            ds.attrs["written"] = utc_now()
            self.f.flush()
            ti.move(tmp, method)
            self.f.flush()
            if caught:
                raise caught[0]
        except (OSError, RuntimeError) as exc:
            # as StoreWriter.write: HDF5 cannot be trusted in this process after a failed write
            failed = True
            with contextlib.redirect_stderr(io.StringIO()):
                held.clear()
            error = StoreError(f"writing token importance of example {index} to {self.path} failed"
                               f" ({first_line(exc)}); what was written before is kept: run the same command"
                               " again to resume")
            error.end_process = True
            self.poisoned = True
            raise error from None
        finally:
            held.clear()
            if not failed:
                sys.unraisablehook = hook

    def close(self) -> None:
        if getattr(self, "poisoned", False):
            return
        super().close()
