"""Writing results so that nothing already written is lost: a file is replaced whole or
not at all, a model folder is swapped in only once complete.

Every output is built under a private temporary name in the output's own folder and
renamed over the output at the end. A symbolic link at the output's name is replaced by
the new file or folder (the rename replaces the link itself): a link is never written
through and a dangling one never followed. The finished output gets the usual mode under
the user's umask (files 0666 & ~umask, folders 0777 & ~umask, as ``open`` and ``mkdir``
would give), while the temporary one keeps its private mode until the rename."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from .errors import OptionError


def umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it
    os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode a new file gets from ``open``: 0666 under the umask."""
    return 0o666 & ~umask()


def folder_mode() -> int:
    """The mode a new folder gets from ``mkdir``: 0777 under the umask."""
    return 0o777 & ~umask()


@contextlib.contextmanager
def replaced(path: str | os.PathLike, suffix: str = ".tmp", make_parents: bool = True):
    """Yield a fresh temporary path beside ``path`` to write the result to; when the block
    ends without error it gets the usual file mode and is renamed over ``path`` (a link
    there is replaced, not followed), otherwise removed (``path`` untouched). ``suffix``
    keeps a file name extension for writers that read it (matplotlib)."""
    path = Path(path)
    if make_parents:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=suffix, dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
        os.chmod(tmp, file_mode())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_atomic(path: str | os.PathLike, data: str | bytes, make_parents: bool = False) -> None:
    """Write ``data`` through a temporary file in the same folder and rename it over ``path``
    (a symbolic link at ``path`` is replaced by the file, its target left as it is)."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    if not folder.exists():
        raise OptionError(f"cannot write {path}: the folder {folder} does not exist")
    if path.is_dir() and not path.is_symlink():
        raise OptionError(f"cannot write {path}: it is a directory")
    try:
        with replaced(path, make_parents=False) as tmp:
            if isinstance(data, str):
                tmp.write_text(data, encoding="utf-8", newline="")
            else:
                tmp.write_bytes(data)
    except OSError as exc:
        raise OptionError(f"cannot write {path}: {exc.strerror or exc}") from None


def strict_json(obj):
    """``obj`` with NaN and infinities as None (numpy scalars and arrays as Python's), so that
    it is strict JSON: what JSON.parse and other readers accept."""
    import math

    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    if hasattr(obj, "tolist") and hasattr(obj, "dtype"):  # numpy scalars and arrays
        return strict_json(obj.tolist())
    return obj


def write_json(path: str | os.PathLike, obj, indent: int = 2, make_parents: bool = False, **dump) -> None:
    """``obj`` as JSON (one trailing newline), written atomically."""
    write_atomic(path, json.dumps(obj, indent=indent, **dump) + "\n", make_parents=make_parents)


def temp_dir_for(out: str | os.PathLike) -> Path:
    """A fresh hidden folder beside ``out`` to build a result folder in."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))


def swap_dir_in(tmp: Path, out: str | os.PathLike) -> None:
    """Move the complete folder ``tmp`` to ``out``, its folders and files given the usual
    modes (it is a result written by attattr, nothing in it executable); an existing
    ``out`` is moved aside first and removed only after the new one is in place (a symbolic
    link there, dangling or not, is replaced: its target is left as it is)."""
    out = Path(out)
    files, folders = file_mode(), folder_mode()
    for where, _subdirs, names in os.walk(tmp):
        # some writers (safetensors) leave private files: the whole folder gets the usual modes
        os.chmod(where, folders)
        for name in names:
            if not os.path.islink(os.path.join(where, name)):
                os.chmod(os.path.join(where, name), files)
    old = None
    if out.exists() or out.is_symlink():
        old = out.parent / f".{out.name}.old-{int(time.time())}-{os.getpid()}"
        out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        if old is not None:
            old.rename(out)
        raise
    if old is not None:
        if old.is_dir() and not old.is_symlink():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink()
