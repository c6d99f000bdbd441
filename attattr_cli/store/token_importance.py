"""Token importance in the store, one schema for every method (docs/store.md, "Token
importance"): ``/examples/NNNNNNNN/token_importance/<method>``, [n] float32, written as
``.partial-<method>`` and renamed when complete; one already there with other params is
refused, never overwritten.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
from pathlib import Path

import h5py
import numpy as np

from ..errors import StoreError, first_line
from ..fileio import FULL, dumps as strict_dumps, no_space, os_errno  # strict JSON: no NaN or Infinity
from .schema import EXAMPLES, PARTIAL_PREFIX
from .opening import copy_root, hdf5_writing, open_file, utc_now
from .reader import Store

GROUP = "token_importance"


def read_token_importance(store: Store, index: int) -> dict[str, np.ndarray]:
    """{method: [n] float32} stored for one example (empty when none)."""
    g = store._group(index)
    if GROUP not in g:
        return {}
    return {m: g[GROUP][m][()] for m in g[GROUP] if not m.startswith(PARTIAL_PREFIX)}


class TokenImportanceStore(Store):
    """A store opened for reading examples and their token importance vectors, and, when
    ``writable``, adding vectors (otherwise opened read-only and ``write`` does nothing: an
    analysis never changes the store it reads unless asked to keep its vectors there)."""

    def __init__(self, path: str | os.PathLike, writable: bool = True):
        self.writable = writable
        self.notes: list[str] = []
        try:
            super().__init__(path, _mode="r+" if writable else "r")
        except StoreError as exc:
            if not writable or getattr(exc, "truncated", None) is None:
                raise
            # cut short by a write that failed (a full disk): rebuilt from what is there
            reader = Store(path)
            try:
                self._rebuild(reader.f)
            finally:
                reader.close()
            super().__init__(path, _mode="r+")

    def _rebuild(self, src: h5py.File) -> None:
        """Copy the store into a fresh file that replaces it: every complete example whole,
        its token importance vectors but the partial or unreadable ones (left by a write that
        failed; they are computed again). HDF5 cannot always delete them in place."""
        real = Path(self.path).resolve()
        if shutil.disk_usage(real.parent).free < real.stat().st_size + (1 << 16):
            raise no_space(self.path, errno.ENOSPC, "it needs repair beside it and nothing was changed")
        tmp = real.parent / f".{real.name}.rebuilding-{os.getpid()}"
        dropped = 0
        try:
            with h5py.File(tmp, "w") as dst:
                dest = copy_root(src, dst)
                for name in src[EXAMPLES]:
                    if name.startswith(PARTIAL_PREFIX):
                        continue
                    g, d = src[EXAMPLES][name], dest.create_group(name)
                    d.attrs.update(dict(g.attrs))
                    for child in g:
                        if child != GROUP:
                            src.copy(g[child], d, child)
                            continue
                        vectors = d.create_group(GROUP)
                        for m in g[GROUP]:
                            try:
                                if m.startswith(PARTIAL_PREFIX):
                                    raise KeyError(m)
                                src.copy(g[GROUP][m], vectors, m)
                            except (OSError, RuntimeError, KeyError, ValueError):
                                dropped += 1
                                if m in vectors:
                                    del vectors[m]
            os.chmod(tmp, stat.S_IMODE(real.stat().st_mode))
            if self.__dict__.get("f") is not None and self.f.id.valid:
                self.f.close()
            os.replace(tmp, real)
        finally:
            tmp.unlink(missing_ok=True)
        self.notes.append(f"{self.path} could not be repaired in place (a write that failed left it so): copied into"
                          f" a fresh file that replaced it ({dropped} unfinished token importance vector"
                          f"{'s' if dropped != 1 else ''} left out, computed again)")

    def stored(self, index: int, method: str, params: dict) -> np.ndarray | None:
        """The stored vector when it was made with ``params``; None when absent.

        Raises StoreError when it is there with other params."""
        g = self._group(index)
        if GROUP not in g or method not in g[GROUP]:
            return None
        ds = g[GROUP][method]
        there = json.loads(ds.attrs.get("params", "{}"))
        if there != params:
            diff = sorted(k for k in set(there) | set(params) if there.get(k) != params.get(k))
            key = diff[0] if diff else "params"
            raise StoreError(f"{self.path} holds '{method}' token importance made with other settings ({key}="
                             f"{there.get(key)!r} there, {params.get(key)!r} here): use the same settings or a copy"
                             " of the store")
        return ds[()]

    def write(self, index: int, method: str, values: np.ndarray, params: dict, description: str = "") -> None:
        if not self.writable:
            return
        g = self._group(index)
        n = int(g.attrs.get("n_tokens", len(g["tokens"])))
        values = np.asarray(values, dtype=np.float32)
        if values.shape != (n,):
            raise StoreError(f"token importance '{method}' of example {index} has shape {values.shape}, expected ({n},)")
        held = []
        try:
            with hdf5_writing(held) as caught:
                ti = g.require_group(GROUP)
                held.append(ti)
                if method in ti:
                    return
                tmp = PARTIAL_PREFIX + method
                if tmp in ti:
                    try:
                        del ti[tmp]
                    except (KeyError, OSError, RuntimeError):  # left by a write that failed: HDF5 cannot delete it
                        held.clear()
                        self._rebuild(self.f)
                        self.f = open_file(self.path, "r+")
                        return self.write(index, method, values, params, description)
                ds = ti.create_dataset(tmp, data=values)
                held.append(ds)
                ds.dims[0].label = "token"
                ds.attrs.update(method=method, description=description, params=strict_dumps(params, sort_keys=True),
                                written=utc_now())
                self.f.flush()
                ti.move(tmp, method)
                self.f.flush()
                if caught:
                    raise caught[0]
        except (OSError, RuntimeError) as exc:  # as StoreWriter.write: HDF5 cannot be trusted in this process now
            code = os_errno(exc)
            if code in FULL:
                error = no_space(self.path, code, f"writing token importance of example {index} failed; what was"
                                 " written before is kept", " to resume")
            else:
                error = StoreError(f"writing token importance of example {index} to {self.path} failed"
                                   f" ({first_line(exc)}); what was written before is kept: run the same command"
                                   " again to resume")
            error.end_process = True
            self.poisoned = True
            raise error from None

    def close(self) -> None:
        if getattr(self, "poisoned", False):
            return
        super().close()
