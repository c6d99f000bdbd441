"""Writing results so that nothing already written is lost: a file is replaced whole or
not at all, a model folder is swapped in only once complete."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import OptionError


@contextlib.contextmanager
def replaced(path: str | os.PathLike, suffix: str = ".tmp", make_parents: bool = True):
    """Yield a fresh temporary path beside ``path`` to write the result to; when the block
    ends without error it is renamed over ``path``, otherwise removed (``path`` untouched).
    ``suffix`` keeps a file name extension for writers that read it (matplotlib)."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike, data: str | bytes, make_parents: bool = False) -> None:
    """Write ``data`` through a temporary file in the same folder and rename it over ``path``."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    if not folder.exists():
        raise OptionError(f"cannot write {path}: the folder {folder} does not exist")
    if path.is_dir():
        raise OptionError(f"cannot write {path}: it is a directory")
    try:
        with replaced(path, make_parents=False) as tmp:
            if isinstance(data, str):
                tmp.write_text(data, encoding="utf-8", newline="")
            else:
                tmp.write_bytes(data)
    except OSError as exc:
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}") from None


def write_json(path: str | os.PathLike, obj, indent: int = 2, make_parents: bool = False, **dump) -> None:
    """``obj`` as JSON (one trailing newline), written atomically."""
    write_atomic(path, json.dumps(obj, indent=indent, **dump) + "\n", make_parents=make_parents)


def temp_dir_for(out: str | os.PathLike) -> Path:
    """A fresh hidden folder beside ``out`` to build a result folder in."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))


def swap_dir_in(tmp: Path, out: str | os.PathLike) -> None:
    """Move the complete folder ``tmp`` to ``out``; an existing ``out`` is moved aside first
    and removed only after the new one is in place."""
    out = Path(out)
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{int(time.time())}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
