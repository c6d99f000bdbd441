"""Writing examples into a store, creating it or resuming it (docs/store.md, "Writing rules" and
"Guarantees"); each process of a distributed run writes its own shard, ``merging.merge`` joins them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import stat
from concurrent.futures import ThreadPoolExecutor, wait as futures_wait
from pathlib import Path

try:
    import resource
except ImportError:  # not on Windows
    resource = None

import h5py
import numpy as np

from .. import __version__
from ..errors import AttattrError, ResourceError, StoreError, first_line
from .family import family_arrays, self_maps_info, write_family
from .steps import write_steps
from .fingerprint import check_fingerprint
from .reader import already_done  # noqa: F401  (re-exported: engine/run)
from .opening import (UTF8, OpenFile, check_schema, check_store_path, copy_root, hdf5_writing, open_file,
                      open_padded, read_attr, stored_below, utc_now)
from .schema import (EXAMPLES, FAMILIES, PARTIAL_PREFIX, PROVENANCE, SCHEMA_NAME, SCHEMA_VERSION, SHARD_EXAMPLES,
                     STORE_DTYPES, example_name)
from ..fileio import FULL, dumps as strict_dumps, no_space, os_errno  # strict JSON: no NaN or Infinity


# what the space check adds to an example's arrays: attributes, links, chunk indexes
_OVERHEAD = 64 * 1024
# space a new store's skeleton needs
_SKELETON = 64 * 1024
# the most bytes of examples (their arrays, uncompressed) waiting to be written behind
BEHIND_BYTES = 2 * 1024**3


def free_bytes(folder: Path) -> int:
    """Bytes free to this user on the file system holding ``folder``."""
    return shutil.disk_usage(folder).free


def file_size_room(path: Path) -> int | None:
    """How many more bytes ``path`` may grow under the process's file size limit
    (``ulimit -f``); None when there is no limit."""
    if resource is None:
        return None
    soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
    if soft == resource.RLIM_INFINITY:
        return None
    return max(0, soft - (path.stat().st_size if path.exists() else 0))


def _mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB"


class StoreWriter(OpenFile):
    """Appends examples to a store, creating it or resuming it (docs/store.md, "Guarantees":
    creating, a full disk, resuming). ``notes`` says when a store HDF5 could not repair in place
    was copied into a fresh file. A write that fails raises a StoreError (ResourceError for lack
    of space) with ``end_process`` set: HDF5's state in this process can no longer be trusted,
    so the CLI ends the process at once; after that ``close`` does nothing.
    """

    def __init__(self, path: str | os.PathLike, fingerprint: dict, provenance: dict,
                 store_dtype: str = "float32", shard: str = "", assigned: list[int] | None = None,
                 behind: bool = False):
        """``shard`` ("k/n") and ``assigned`` (the indices that process k of n was given) mark a
        shard of a distributed run; the assignment lets a merge tell a finished shard from an
        interrupted one. ``behind``: :meth:`write` hands the example to a thread of its own and
        returns (see there)."""
        self._behind = ThreadPoolExecutor(1, thread_name_prefix="attattr-store") if behind else None
        self._pending: list = []  # (future, bytes) of the examples handed to that thread, oldest first
        self._handed: set = set()  # the indices handed to it
        if store_dtype not in STORE_DTYPES:
            raise StoreError(f"unknown store dtype '{store_dtype}'; available: {', '.join(STORE_DTYPES)}")
        self.path = Path(path)
        self.store_dtype = np.float16 if store_dtype == "float16" else np.float32
        self.fingerprint = fingerprint = dict(fingerprint, store_dtype=store_dtype)
        self.poisoned = False
        self.notes: list[str] = []
        self._held: list = []
        check_store_path(self.path)
        while True:
            existed = self.path.exists() and self.path.stat().st_size > 0
            if existed:
                self._open_existing(fingerprint)
                break
            if self._create(fingerprint, provenance, shard):
                break
        try:
            if assigned is not None:
                if SHARD_EXAMPLES in self.f:
                    del self.f[SHARD_EXAMPLES]
                self.f.create_dataset(SHARD_EXAMPLES, data=np.asarray(sorted(assigned), dtype=np.int64))
                self.f.attrs["shard"] = shard
                self.f.flush()
        except (OSError, RuntimeError) as exc:
            raise self._failed(exc, "recording the shard's examples") from None
        self.done = {int(n) for n in self.f[EXAMPLES] if not n.startswith(PARTIAL_PREFIX)}
        self.created = not existed

    def _create(self, fingerprint: dict, provenance: dict, shard: str) -> bool:
        """Write a new store's skeleton under a temporary name and link it into place; False
        when another process created ``path`` meanwhile (the caller then opens that one)."""
        folder = self.path.parent
        if free_bytes(folder) < _SKELETON:
            raise ResourceError(f"cannot create {self.path}: only {_mb(free_bytes(folder))} are free on its disk")
        tmp = folder / f".{self.path.name}.creating-{os.getpid()}-{secrets.token_hex(4)}"
        self.f = f = open_file(tmp, "w-")
        try:
            f.attrs["schema"] = SCHEMA_NAME
            f.attrs["schema_version"] = SCHEMA_VERSION
            f.attrs["attattr_version"] = __version__
            f.attrs["created"] = utc_now()
            f.attrs["fingerprint"] = strict_dumps(fingerprint, sort_keys=True)
            f.attrs["shard"] = shard
            f.create_group(EXAMPLES)
            prov = f.create_group(PROVENANCE)
            for key, value in provenance.items():
                prov.attrs[key] = value if isinstance(value, (str, int, float)) else strict_dumps(value)
            prov.attrs["runs"] = "[]"
            f.flush()
        except (OSError, RuntimeError) as exc:
            self.poisoned = True
            tmp.unlink(missing_ok=True)
            raise self._failed(exc, "creating the store") from None
        try:
            try:
                os.link(tmp, self.path)  # fails if anything is there, a dangling link included
            except FileExistsError:
                if self.path.exists() and self.path.stat().st_size > 0:  # another writer was first
                    self.f.close()
                    return False
                os.replace(tmp, self.path)  # a dangling symlink or an empty file: replaced
            except OSError:  # a file system without hard links
                os.replace(tmp, self.path)
        except BaseException:
            self.close()
            raise
        finally:
            tmp.unlink(missing_ok=True)
        return True

    def _open_existing(self, fingerprint: dict) -> None:
        if not h5py.is_hdf5(self.path):
            raise StoreError(f"{self.path} exists and is not an HDF5 store; it was left as it is")
        try:
            self.f = open_file(self.path, "r+")
        except StoreError as exc:
            if getattr(exc, "truncated", None) is None:
                raise
            self._recover_truncated(exc)
            return
        try:
            check_schema(self.f, self.path)
            there = json.loads(read_attr(self.f, "fingerprint", "{}"))
            check_fingerprint(self.path, there, fingerprint)
        except StoreError:
            self.f.close()
            raise
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            self.f.close()
            raise StoreError(f"{self.path} is damaged ({first_line(exc)}); it was left as it is") from exc
        try:
            leftovers = [name for name in self.f[EXAMPLES] if name.startswith(PARTIAL_PREFIX)]
            for name in leftovers:
                del self.f[EXAMPLES][name]
            if leftovers:
                self.f.flush()
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            with contextlib.suppress(OSError, RuntimeError, KeyError, ValueError):
                if self.f.id.valid:
                    self.f.close()
            self._recover(exc)

    def _recover_truncated(self, reason: StoreError) -> None:
        """A store shorter than HDF5 recorded (a write that failed on a full disk): read as if
        padded with zeros, its complete examples whose data lie wholly within the bytes that
        are there are copied into a fresh file."""
        size, recorded = reason.truncated
        self._recover(f"it is {recorded - size} bytes shorter than HDF5 recorded, as a write that failed"
                      " leaves it", within=size, opener=lambda: open_padded(self.path, recorded))

    def _recover(self, reason: BaseException | str, within: int | None = None, opener=None) -> None:
        """Copy every complete example of the store into a fresh file and swap it in; with
        ``within``, only examples whose raw data lie below that byte offset."""
        why = reason if isinstance(reason, str) else first_line(reason)
        real = self.path.resolve()
        size = real.stat().st_size
        if free_bytes(real.parent) < size + _SKELETON:
            raise ResourceError(f"{self.path} needs repair ({why}), which needs {_mb(size)} free"
                             f" beside it; {_mb(free_bytes(real.parent))} are free: free some space and run again")
        tmp = real.parent / f".{real.name}.recovering-{os.getpid()}-{secrets.token_hex(4)}"
        kept = lost = 0
        try:
            src = opener() if opener else open_file(self.path, "r")
            with src, open_file(tmp, "w-") as dst:
                dest = copy_root(src, dst)
                for name in list(src[EXAMPLES]):
                    if name.startswith(PARTIAL_PREFIX):
                        continue
                    try:
                        g = src[EXAMPLES][name]
                        if not bool(g.attrs.get("complete", False)):
                            continue
                        if within is not None and not stored_below(g, within):
                            lost += 1
                            continue
                        src.copy(src[EXAMPLES][name], dest, name)
                        kept += 1
                    except (OSError, RuntimeError, KeyError, ValueError):
                        if name in dest:
                            del dest[name]
                        lost += 1
                dst.flush()
            os.chmod(tmp, stat.S_IMODE(real.stat().st_mode))
            os.replace(tmp, real)
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            raise StoreError(f"{self.path} could not be repaired in place ({why}) nor copied"
                             f" ({first_line(exc)}); it was left as it is") from exc
        finally:
            tmp.unlink(missing_ok=True)
        self.notes.append(
            f"{self.path} could not be repaired in place ({why}): its {kept} complete examples"
            f" were copied into a fresh file that replaced it" + (f" ({lost} unreadable ones were left out)" if lost else ""))
        self.f = open_file(self.path, "r+")

    def _failed(self, exc: BaseException, doing: str) -> AttattrError:
        """The error for an HDF5 write that failed while ``doing`` (lack of space: the one
        ResourceError line of every command, fileio.no_space); HDF5's state in this process is
        unusable afterwards (see the class docstring)."""
        self.poisoned = True
        code = os_errno(exc)
        kept = self._kept() if getattr(self, "done", None) else "nothing is lost"
        if code in FULL:
            return no_space(self.path, code, f"{doing} failed; {kept}", " to resume")
        error = StoreError(f"{doing} in {self.path} failed ({first_line(exc)}); {kept}: run the same command again"
                           " to resume")
        error.end_process = True
        return error

    def _kept(self) -> str:
        done = len(self.done)
        return f"the {done} complete example{'s' if done != 1 else ''} in it are kept"

    def check_space(self, index: int, need: int) -> None:
        """Refuse (before writing anything) an example of about ``need`` bytes that the disk
        or the file size limit has no room for."""
        need += _OVERHEAD
        free = free_bytes(self.path.parent)
        room = file_size_room(self.path)
        kept = self._kept()
        if need > free:
            raise ResourceError(f"not enough space to write example {index} to {self.path}: it needs about {_mb(need)},"
                             f" {_mb(free)} are free on the disk; {kept}: free some space and run the same command"
                             " again to resume")
        if room is not None and need > room:
            raise ResourceError(f"not enough room to write example {index} to {self.path}: it needs about {_mb(need)},"
                             f" the file size limit (ulimit -f) leaves {_mb(room)}; {kept}: raise the limit and run"
                             " the same command again to resume")

    def close(self) -> None:
        """Wait for the examples written behind (raising the first failure, unless the block
        is left by another error), then close the file."""
        failed = None
        if self._behind is not None:
            pending, self._pending = self._pending, []
            self._behind.shutdown(wait=True)
            self._behind = None
            failed = next(filter(None, (f.exception() for f, _ in pending)), None)  # the first failure
        if not self.poisoned:  # (poisoned: any HDF5 call on this file could crash the process now)
            super().close()
        if failed is not None:
            raise failed

    def __exit__(self, kind, error, trace):
        try:
            self.close()
        except AttattrError:
            if error is None:  # a failed write behind is the error, unless the block raised one
                raise

    def log_run(self, info: dict) -> None:
        prov = self.f[PROVENANCE]
        runs = json.loads(read_attr(prov, "runs", "[]"))
        runs.append(dict(info, started=utc_now()))
        try:
            prov.attrs["runs"] = strict_dumps(runs)
            self.f.flush()
        except (OSError, RuntimeError) as exc:
            raise self._failed(exc, "recording the run") from None

    def _dataset(self, g, name, **kw):
        ds = g.create_dataset(name, **kw)
        self._held.append(ds)  # closed after the flush, so that a failed write raises there
        return ds

    def _estimate(self, score) -> int:
        """An upper bound of the bytes ``score`` takes in the store: its arrays uncompressed."""
        item = np.dtype(self.store_dtype).itemsize
        total = sum(len(t.encode()) + 16 for t in score.tokens) + len(score.text_a or "") + len(score.text_b or "")
        families = getattr(score, "families", None) or {}
        arrays = [score.input_ids, score.segment_ids, score.logits, score.probs]
        maps = []
        if families:
            for fs in families.values():
                maps += [fs.attribution, fs.attention, fs.head_sum]
                arrays += [fs.head_max, fs.f_baseline, fs.residual, fs.topk_index, fs.topk_value,
                           getattr(fs, "key_sum", None), getattr(fs, "read_sum", None)]
        else:
            maps += [score.attribution, score.attention]
            arrays += [score.head_max, score.f_baseline, score.residual]
        for st in getattr(score, "steps", None) or []:
            maps += [st.family.attribution, st.family.head_sum]
            arrays += [st.family.head_max, st.family.f_baseline, st.family.residual]
        total += sum(int(np.asarray(a).nbytes) for a in arrays if a is not None)
        total += sum(int(np.size(a)) * item for a in maps if a is not None)
        return total

    def write(self, score) -> None:
        """Write one ``ExampleScore`` atomically (see module docstring), after checking that
        the disk has room for it (and for the examples still being written).

        Written behind (``behind``): the example goes to the writer's thread, which writes the
        examples in the order given, and this returns, so that the next example is scored while
        this one is compressed and written (issue 53). A failed write there raises here, at the
        next call, or at :meth:`close`, which waits for every example handed over; nothing is
        written after it. At most BEHIND_BYTES of examples wait."""
        if self._behind is None:
            self._write_now(score)
            return
        self._settle(wait="all" if self.poisoned else None)  # (poisoned: a write failing on the thread now)
        need = self._estimate(score)
        while self._pending and sum(b for _, b in self._pending) + need > BEHIND_BYTES:
            self._settle(wait="oldest")
        # (no HDF5 call here while the thread writes: the examples in the file are those of ``done``)
        if score.index in self.done or score.index in self._handed:
            return
        self.check_space(score.index, need + sum(b for _, b in self._pending))
        self._handed.add(score.index)
        self._pending.append((self._behind.submit(self._write_behind, score), need))

    def _write_behind(self, score) -> None:
        if not self.poisoned:  # after a failed write HDF5's state is not to be trusted: nothing more
            self._write_now(score, checked=True)

    def _settle(self, wait: str | None = None) -> None:
        """Raise the failure of the oldest example the writer's thread is done with, dropping
        those written; ``wait``: "oldest" or "all" of them first."""
        if wait and self._pending:
            futures_wait([f for f, _ in (self._pending[:1] if wait == "oldest" else self._pending)])
        while self._pending and self._pending[0][0].done():
            future, _ = self._pending.pop(0)
            future.result()  # the StoreError or ResourceError of a failed write

    def _write_now(self, score, checked: bool = False) -> None:
        examples = self.f[EXAMPLES]
        final = example_name(score.index)
        if final in examples:
            return
        if not checked:
            self.check_space(score.index, self._estimate(score))
        try:
            with hdf5_writing(self._held) as caught:
                self._write(examples, final, score)
                if caught:
                    raise caught[0]
        except (OSError, RuntimeError) as exc:
            raise self._failed(exc, f"writing example {score.index}") from None
        self.done.add(score.index)

    def _write(self, examples, final: str, score) -> None:
        tmp = PARTIAL_PREFIX + final
        if tmp in examples:
            del examples[tmp]
        g = examples.create_group(tmp)
        self._held.append(g)
        self._dataset(g, "tokens", data=np.array(score.tokens, dtype=object), dtype=UTF8)
        for key in ("input_ids", "segment_ids", "logits", "probs"):
            self._dataset(g, key, data=getattr(score, key))
        if getattr(score, "decoder_tokens", None) is not None:
            self._dataset(g, "decoder_tokens", data=np.array(score.decoder_tokens, dtype=object), dtype=UTF8)
            self._dataset(g, "decoder_input_ids", data=score.decoder_input_ids)
        families = getattr(score, "families", None) or {}
        info = {}
        if not families:  # an ExampleScore built by hand in the 1.0 shape
            write_family(g, {key: getattr(score, key) for key in ("layers", "attribution", "attention", "head_max",
                                                                  "f_baseline", "residual")},
                         self._held, self.store_dtype)
            info["self"] = self_maps_info(score.head_max)
        for name, fs in families.items():
            if name == "self":
                where = g
            else:
                parent = g.require_group(FAMILIES)
                where = parent.create_group(name)
                self._held += [parent, where]
            write_family(where, family_arrays(fs), self._held, self.store_dtype)
            info[name] = {"keep": fs.keep, "heads": int(fs.heads), "query": fs.query_side, "key": fs.key_side}
        if getattr(score, "steps", None):  # schema 1.4: a generation's per-step results (store/steps.py)
            write_steps(g, score.steps, self._held, self.store_dtype)
        a = g.attrs
        a["families"] = strict_dumps(info)
        a["step_batch"] = int(getattr(score, "step_batch", 0) or 0)
        for key in ("index", "gold", "pred", "target", "f_full"):
            a[key] = getattr(score, key)
        a["n_tokens"] = len(score.tokens)
        a["kernel"] = score.kernel
        a["truncated"] = bool(score.truncated)
        a["text_a"] = score.text_a
        a["text_b"] = score.text_b if score.text_b is not None else ""
        a["has_text_b"] = score.text_b is not None
        a["meta"] = strict_dumps(score.meta, sort_keys=True)
        nonfinite = getattr(score, "nonfinite", None)
        if nonfinite:
            a["nonfinite"] = ",".join(nonfinite)
        a["written"] = utc_now()
        a["complete"] = True
        self.f.flush()
        examples.move(tmp, final)
        self.f.flush()
