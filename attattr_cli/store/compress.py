"""Maps compressed on every core (issue 53: a GPU scores a 128-token example in milliseconds,
while HDF5's own filter pipeline deflates its maps on one core at about 60 MB/s).

A map dataset is chunked one layer per chunk and filtered by HDF5's byte shuffle and deflate
(gzip, declared at level :data:`LEVEL`). :func:`write_maps` makes the same dataset, with the
same filters declared, and writes each chunk already filtered (``write_direct_chunk``): the
shuffle done by numpy, the deflate on a thread pool (it lets go of the GIL), so the chunks of an
example's maps compress in parallel. The deflate is ISA-L's (the ``isal`` package: the same
zlib format, about 12 times zlib's speed on maps, within 2 % of its size) where it is installed,
else zlib's at LEVEL, whose bytes are those HDF5 itself writes (tests/test_store.py). Either
way every reader (h5py, HDF5's tools, attattr) reads the file as it is.
"""

from __future__ import annotations

import os
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np

LEVEL = 4
FILTERS = dict(compression="gzip", compression_opts=LEVEL, shuffle=True)

try:  # ISA-L's deflate: a zlib stream HDF5's deflate filter reads, at its default level
    from isal import isal_zlib

    def deflate(data: bytes) -> bytes:
        return isal_zlib.compress(data, isal_zlib.ISAL_DEFAULT_COMPRESSION)

    ENCODER = "isal"
except ImportError:  # (a platform without its wheel) zlib's, the bytes HDF5 itself writes
    def deflate(data: bytes) -> bytes:
        return zlib.compress(data, LEVEL)

    ENCODER = "zlib"

_pool: tuple[int, ThreadPoolExecutor] | None = None  # (the process that made it, the pool)
_lock = threading.Lock()


def workers() -> int:
    """The compressing threads: one per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _shared_pool() -> ThreadPoolExecutor:
    """The process's pool (a forked child makes its own: it holds none of its parent's threads)."""
    global _pool
    with _lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(workers(), thread_name_prefix="attattr-deflate"))
        return _pool[1]


def filtered(chunk: np.ndarray) -> bytes:
    """One chunk as HDF5's shuffle then deflate filters write it: the bytes of each element
    grouped by their place (all first bytes, then all second bytes, ...), then :func:`deflate`."""
    data = np.ascontiguousarray(chunk).view(np.uint8).reshape(-1, chunk.dtype.itemsize)
    return deflate(data.T.tobytes())


def start(arr: np.ndarray) -> list:
    """The filtered chunks of ``arr`` (one per leading index) begun on the pool: futures, or the
    bytes themselves where there is one chunk. Begin every map of an example before writing the
    first, so that all their chunks share the cores."""
    if not arr.size:
        return []
    if len(arr) == 1:
        return [filtered(arr[0])]
    pool = _shared_pool()
    return [pool.submit(filtered, chunk) for chunk in arr]


def write_maps(create, name: str, arr: np.ndarray, started: list | None = None):
    """``create(name, **kw)`` -> a dataset of ``arr``'s shape and dtype, one chunk per leading
    index, with :data:`FILTERS`; its chunks filtered on the pool (``started``: :func:`start`'s
    of this ``arr``) and written as they are. An empty ``arr`` is written plainly (no chunks,
    no filters)."""
    if not arr.size:
        return create(name, data=arr)
    ds = create(name, shape=arr.shape, dtype=arr.dtype, chunks=(1, *arr.shape[1:]), **FILTERS)
    zero = (0,) * (arr.ndim - 1)
    for i, data in enumerate(start(arr) if started is None else started):
        ds.id.write_direct_chunk((i, *zero), data if isinstance(data, bytes) else data.result())
    return ds
