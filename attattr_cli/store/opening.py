"""Opening an attattr HDF5 store: h5py errors as StoreErrors, the schema check, shared helpers.

Crash safety (see writer.py and merging.py): each example is written into a hidden group
``examples/.partial-N``, marked complete, then renamed to ``examples/N`` and the file flushed.
A reader lists only complete, renamed groups, and a writer deletes leftover partial groups when
it opens the store, so an interrupted run never leaves a half-written example that reads as whole.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path

import h5py
import numpy as np

from .. import __version__
from ..errors import StoreError
from .schema import EXAMPLES, PROVENANCE, SCHEMA_MAJOR, SCHEMA_NAME

UTF8 = h5py.string_dtype("utf-8")


def utc_now() -> str:
    """The time now, UTC, to the second, in ISO 8601."""
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def read_attr(obj, name, default=None):
    """An HDF5 attribute as a plain Python value (bytes decoded, numpy scalars unwrapped)."""
    value = obj.attrs.get(name, default)
    if isinstance(value, bytes):
        value = value.decode()
    if isinstance(value, np.generic):
        value = value.item()
    return value


def open_file(path: Path, mode: str) -> h5py.File:
    """h5py.File(path, mode), with its failures (locked, missing, not HDF5) as one-line StoreErrors."""
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
        raise StoreError(
            f"{path} has store schema {version}, newer than this attattr {__version__} reads "
            f"({SCHEMA_MAJOR}.x): upgrade attattr"
        )
    if EXAMPLES not in f or PROVENANCE not in f:
        raise StoreError(f"{path} is damaged: it lacks the '{EXAMPLES}' or '{PROVENANCE}' group")


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
