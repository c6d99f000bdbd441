"""Opening an attattr HDF5 store: h5py errors as StoreErrors, the schema check, shared helpers.
The crash-safe writing rule they serve (partial group, ``complete``, rename, flush) is
docs/store.md, "Writing rules".
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import errno
import io
import os
import re
import sys
from pathlib import Path

import h5py
import numpy as np

from .. import __version__
from ..errors import StoreError
from ..fileio import check_store_output, os_errno
from .schema import EXAMPLES, PROVENANCE, SCHEMA_MAJOR, SCHEMA_NAME

UTF8 = h5py.string_dtype("utf-8")


def utc_now() -> str:
    """The time now, UTC, to the second, in ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_attr(obj, name, default=None):
    """An HDF5 attribute as a plain Python value (bytes decoded, numpy scalars unwrapped)."""
    value = obj.attrs.get(name, default)
    if isinstance(value, bytes):
        value = value.decode("utf-8", "surrogateescape")  # bytes that are not UTF-8 print as \\xNN
    if isinstance(value, np.generic):
        value = value.item()
    return value


def open_file(path: Path, mode: str, locking: bool | None = None) -> h5py.File:
    """h5py.File(path, mode), with its failures (locked, missing, read-only, not HDF5) as
    one-line StoreErrors. ``locking=False`` opens without HDF5's file lock (live readers,
    see reader.py)."""
    kwargs = {} if locking is None else {"locking": locking}
    try:
        try:
            return h5py.File(path, mode, **kwargs)
        except OSError as exc:
            if kwargs and "locking flag values don't match" in str(exc):  # open in this process already
                return h5py.File(path, mode)
            raise
    except OSError as exc:
        code = os_errno(exc)
        # another process holds the file's lock (HDF5's "unable to lock file" with EAGAIN), and only then:
        # other messages that happen to contain "lock" (a truncated file's "sblock->base_addr") are not it
        if isinstance(exc, BlockingIOError) or ("unable to lock file" in str(exc)
                                                and code in (errno.EAGAIN, errno.EWOULDBLOCK)):
            raise StoreError(f"{path} is open for writing in another process") from exc
        if mode == "r" and not path.exists():
            raise StoreError(f"no such store: {path}") from exc
        if mode != "r" and code in (errno.EROFS, errno.EACCES, errno.EPERM):
            why = "it is on a read-only file system" if code == errno.EROFS else "permission denied"
            raise StoreError(f"cannot write to {path}: {why}") from exc
        text = str(exc)
        if "truncated file" in text:
            m = re.search(r"eof = (\d+).*stored_eof = (\d+)", text)
            error = StoreError(f"{path} is damaged: the file is shorter than HDF5 recorded (cut short, e.g. by"
                               " an interrupted copy or a full disk); it was left as it is")
            error.truncated = (int(m.group(1)), int(m.group(2))) if m else None  # (size, recorded size)
            raise error from exc
        first = text.splitlines()[0] if text else type(exc).__name__
        raise StoreError(f"{path} is not a readable HDF5 store ({first}); it was left as it is") from exc


class _Padded(io.RawIOBase):
    """A file read as if it were ``size`` bytes long, zeros past its real end: lets HDF5
    open a store cut short by a failed write without changing a byte of it."""

    def __init__(self, path: Path, size: int):
        self._f = open(path, "rb")
        self._real = os.fstat(self._f.fileno()).st_size
        self._size = max(size, self._real)
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readinto(self, buffer) -> int:
        view = memoryview(buffer).cast("B")
        n = max(0, min(len(view), self._size - self._pos))
        got = 0
        if self._pos < self._real:
            self._f.seek(self._pos)
            got = self._f.readinto(view[:min(n, self._real - self._pos)]) or 0
        view[got:n] = bytes(n - got)
        self._pos += n
        return n

    def close(self) -> None:
        self._f.close()
        super().close()


def open_padded(path: Path, size: int) -> h5py.File:
    """A store cut short (see ``StoreError.truncated``), opened read-only as if ``size`` bytes
    long; only data below its real end may be trusted (:func:`stored_below`)."""
    return h5py.File(_Padded(path, size), "r")


def stored_below(group, limit: int) -> bool:
    """True when every dataset under ``group`` keeps its raw data below byte ``limit``."""
    ends: list[int] = []

    def visit(_name, obj):
        if not isinstance(obj, h5py.Dataset):
            return
        dsid = obj.id
        if obj.chunks is None:
            offset = dsid.get_offset()
            if offset is not None:
                ends.append(offset + dsid.get_storage_size())
            return
        for i in range(dsid.get_num_chunks()):
            info = dsid.get_chunk_info(i)
            ends.append(info.byte_offset + info.size)

    try:
        group.visititems(visit)
    except (OSError, RuntimeError, KeyError, ValueError):
        return False
    return all(end <= limit for end in ends)


def copy_root(src: h5py.File, dst: h5py.File) -> h5py.Group:
    """Into the new file ``dst``: the root attributes of ``src`` and every root item but its
    examples, which are left to the caller: their (empty) group is returned."""
    dst.attrs.update(dict(src.attrs))
    for name in src:
        if name != EXAMPLES:
            src.copy(src[name], dst, name=name)
    examples = dst.create_group(EXAMPLES)
    examples.attrs.update(dict(src[EXAMPLES].attrs))
    return examples


def check_store_path(path: Path) -> None:
    """Refuse, before anything is written, a store path that is a device or a FIFO
    (``fileio.check_store_output``), a folder, or in a folder that does not exist."""
    check_store_output(path)
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a store")
    if not path.parent.exists():
        raise StoreError(f"cannot create {path}: the folder {path.parent} does not exist")


def check_schema(f: h5py.File, path: Path) -> None:
    """Refuse a file that is not an attattr store, is from a newer schema major, or lacks its groups."""
    name = read_attr(f, "schema")
    if name != SCHEMA_NAME:
        raise StoreError(f"{path} is an HDF5 file but not an attattr store (schema attribute: {name!r})")
    version = str(read_attr(f, "schema_version", "0"))
    try:
        major = int(version.split(".")[0])
    except ValueError:
        raise StoreError(f"{path} has an unreadable schema version {version!r}") from None
    if major > SCHEMA_MAJOR:
        raise StoreError(f"{path} has store schema {version}, newer than this attattr {__version__} reads"
                         f" ({SCHEMA_MAJOR}.x): upgrade attattr")
    if EXAMPLES not in f or PROVENANCE not in f:
        raise StoreError(f"{path} is damaged: it lacks the '{EXAMPLES}' or '{PROVENANCE}' group")


@contextlib.contextmanager
def hdf5_writing(held: list):
    """Around an HDF5 write whose h5py objects are kept in ``held`` (let go when the block ends,
    after the writer's flush, so that a failed write raises there): yields the list of the
    failures h5py reports only as it frees an object. After a failed write (OSError,
    RuntimeError) the collector stays installed: the objects left (here and in the traceback's
    frames) fail again as they are freed, and HDF5's state in this process cannot be trusted."""
    caught: list[BaseException] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: caught.append(unraisable.exc_value)
    failed = False
    try:
        yield caught
    except (OSError, RuntimeError):
        failed = True
        with contextlib.redirect_stderr(io.StringIO()):  # h5py prints those failures itself
            held.clear()
        raise
    finally:
        held.clear()
        if not failed:
            sys.unraisablehook = hook


class OpenFile:
    """An open h5py file in ``self.f``; closes on ``close()`` or leaving a ``with`` block."""

    f: h5py.File

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self) -> None:
        if self.f.id.valid:
            self.f.close()
