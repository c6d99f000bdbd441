"""Writing results so that nothing already written is lost: a file is replaced whole or not
at all (under a private temporary name beside it, renamed over it), a folder swapped in only
once complete, a device or a FIFO streamed in place, an output that is an input refused, a
write without room one ``ResourceError`` line. The one output rule of every command and API
function that writes, stated for users in docs/cli.md, "Outputs, failures and exit statuses",
and docs/store.md, "Other output files"; each function below says its part."""

from __future__ import annotations

import contextlib
import errno
import io
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
import time
from pathlib import Path

from .errors import AttattrError, OptionError, ResourceError, first_line

# the errors of a write that had no room, and how each is said
FULL = {errno.ENOSPC: "the disk is full", errno.EDQUOT: "the disk quota is used up",
        errno.EFBIG: "the file size limit was reached"}


def os_errno(exc: BaseException) -> int | None:
    """The operating system's errno behind a failed write: ``exc.errno``, else the
    ``errno = N`` HDF5 writes into its messages (h5py raises RuntimeError with it)."""
    if isinstance(exc, OSError) and exc.errno:
        return exc.errno
    # HDF5's message; safetensors' (Rust's io error, in either of its wordings)
    m = re.search(r"errno = (\d+)|Os \{ code: (\d+)|\(os error (\d+)\)", str(exc))
    return int(next(g for g in m.groups() if g)) if m else None


def no_space(path, code: int, kept: str = "nothing was replaced", then: str = "") -> ResourceError:
    """The one error of every write that had no room (exit status 5): the output, why, what is
    kept, and what to do. ``end_process`` is set: after a failed HDF5 write HDF5's state in the
    process cannot be trusted (its shutdown would crash), so the CLI ends the process at once."""
    error = ResourceError(f"cannot write {path}: {FULL.get(code, 'no space left')} ({os.strerror(code)}); {kept}:"
                          f" free some space and run the same command again{then}")
    error.end_process = True
    return error


def write_failed(exc: BaseException, path) -> AttattrError:
    """The one-line error for a write of ``path`` that raised ``exc`` (an OSError, or the
    RuntimeError h5py raises for a failed HDF5 write): lack of space as :func:`no_space`,
    anything else as ``cannot write PATH: why`` (exit status 2)."""
    code = os_errno(exc)
    if code in FULL:
        return no_space(path, code)
    why = os.strerror(code) if code else first_line(exc)
    error = OptionError(f"cannot write {path}: {why}; nothing was replaced")
    error.end_process = isinstance(exc, RuntimeError) and code is not None  # an HDF5 write failed: as above
    return error


def is_stream(path: str | os.PathLike) -> bool:
    """True when ``path`` is written in place rather than replaced: a character device, a FIFO
    or a socket (through links), or a name under /dev or /proc (``/dev/stdout`` is a link to
    whatever stdout is, a terminal, a pipe or a file: it is opened, never replaced)."""
    try:
        mode = os.stat(path).st_mode
    except (OSError, ValueError):
        return False
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        return True
    return not stat.S_ISDIR(mode) and os.path.abspath(path).startswith(("/dev/", "/proc/"))


def _paths(values):
    for v in values:
        if v is None:
            continue
        if isinstance(v, (list, tuple, set)):
            yield from _paths(v)
        elif isinstance(v, (str, os.PathLike)) and str(v) not in ("", "-"):
            yield v


def same_file(a, b) -> bool:
    """True when ``a`` and ``b`` are one file (one inode: links of either kind followed)."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError, TypeError):
        return False


def check_output(out, inputs=(), name: str = "--out") -> None:
    """Refuse (before any work) an output ``out`` that is the same file as one of ``inputs``
    (paths, lists of paths; None and non-paths ignored): writing it would destroy the input.
    A device or a FIFO (``/dev/null``) is never an input that a write destroys."""
    if not _a_file_path(out):
        return
    for given in _paths(inputs):
        if same_file(out, given):
            said = f"{out}" if str(out) == str(given) else f"{out} ({given})"
            raise OptionError(f"{name} {said} is the same file as an input: writing it would destroy the input;"
                              " choose another output")


def check_store_output(path, name: str = "--out") -> None:
    """An HDF5 store is written where it lies (created, resumed, extended): refuse a path that
    is a device, a FIFO or a socket (it would be replaced or cannot be seeked)."""
    if is_stream(path):
        raise OptionError(f"cannot write a store to {path}: it is not a regular file (a store is written where it"
                          f" lies and resumed there); give a file path")


def _a_file_path(path) -> bool:
    """``path`` names a file to write (not None, ``-``, a device, a FIFO or a socket, which are
    streamed in place)."""
    return isinstance(path, (str, os.PathLike)) and str(path) not in ("", "-") and not is_stream(path)


def check_writable(path, name: str = "--out") -> None:
    """Refuse before any work an output that could not be written at the end: a folder that
    is read-only (on a read-only file system, or without write permission: the output is
    written beside its name and renamed over it), or an existing file that is read-only (as
    a store opened for writing is refused). A device, a FIFO, ``-`` or None pass."""
    if not _a_file_path(path):
        return
    target = Path(path)
    folder = target.parent

    def why(where) -> str:
        with contextlib.suppress(OSError, AttributeError):
            if os.statvfs(where).f_flag & os.ST_RDONLY:
                return "on a read-only file system"
        return "permission denied"

    if folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
        raise OptionError(f"{name} {path} cannot be written: its folder {folder} is not writable ({why(folder)});"
                          " nothing was computed")
    if target.is_file() and not target.is_symlink() and not os.access(target, os.W_OK):
        raise OptionError(f"{name} {path} cannot be written: the file is read-only ({why(folder)}); it was left"
                          " as it is")


def check_file_output(path, inputs=(), name: str = "--out") -> None:
    """The output rule for a result file written whole (not streamed), checked before any
    work: not a device, a FIFO or a socket (``/dev/...``), not a folder, not the same file as
    one of ``inputs`` (:func:`check_output`), and writable (:func:`check_writable`)."""
    if path is None:
        return
    if is_stream(path):
        raise OptionError(f"{name} {path} is a device, a FIFO or a socket, not a file: give a file path")
    if os.path.isdir(path):
        raise OptionError(f"{name} {path} is a folder: give a file path")
    check_output(path, inputs, name)
    check_writable(path, name)


# the outputs this process holds the one-writer lock of (see ``one_writer``): path -> depth
_WRITING: dict[str, int] = {}


@contextlib.contextmanager
def one_writer(path, name: str = "--out"):
    """Inside, this process is the one writer of ``path``: a second process (a second run onto
    the same output) is refused at once, in one line, as a second writer of a store is (HDF5's
    lock). The lock is an exclusive ``flock`` on a hidden file beside the output
    (``.NAME.lock``), removed when the block ends (a crash leaves the file, not the lock).
    Taken again by the same process (a function that writes what its caller locked) it is
    shared. A device, a FIFO, ``-`` or None take no lock."""
    if not _a_file_path(path):
        yield
        return
    try:
        import fcntl
    except ImportError:  # no flock (Windows): no lock
        yield
        return
    target = Path(os.path.abspath(path))
    key = str(target)
    if key in _WRITING:
        _WRITING[key] += 1
        try:
            yield
        finally:
            _WRITING[key] -= 1
        return
    lock = target.parent / f".{target.name}.lock"
    while True:
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise write_failed(exc, path) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
                raise OptionError(f"{name} {path} is being written by another process (it holds {lock}); wait for"
                                  " it to finish or choose another output") from None
            raise write_failed(exc, path) from None
        try:  # the last holder removes the file as it lets go: locked a removed one, take the new one
            held = os.path.samestat(os.fstat(fd), os.stat(lock))
        except OSError:
            held = False
        if held:
            break
        os.close(fd)
    _WRITING[key] = 1
    try:
        yield
    finally:
        del _WRITING[key]
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def open_stream(path):
    """``path`` (a device, a FIFO, /dev/stdout) opened for writing in place. Where it is this
    process's own stdout or stderr (``/dev/stdout`` with stdout redirected to a file), the
    output goes on after what was printed there, through that descriptor, instead of a new
    one that would truncate the file and write over it."""
    with contextlib.suppress(OSError):
        st = os.stat(path)
        for fd, stream in ((1, sys.stdout), (2, sys.stderr)):
            other = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino):
                with contextlib.suppress(AttributeError, ValueError, OSError):
                    stream.flush()
                return open(os.dup(fd), "wb")
    return open(path, "wb")


def umask() -> int:
    """The process's umask, read without changing it where the system allows."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status", encoding="ascii") as fh:
        for line in fh:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)  # elsewhere the only way to read it is to set it
    os.umask(mask)
    return mask


@contextlib.contextmanager
def replaced(path: str | os.PathLike, suffix: str = ".tmp", make_parents: bool = True):
    """Yield a fresh temporary path beside ``path`` to write the result to; when the block
    ends without error it gets the usual file mode and is renamed over ``path`` (a link
    there is replaced, not followed), otherwise removed (``path`` untouched). ``suffix``
    keeps a file name extension for writers that read it (matplotlib). A device, a FIFO or
    /dev/stdout at ``path`` (``is_stream``) gets the finished bytes written into it in place.
    A write that fails (an OSError, or h5py's RuntimeError for a failed HDF5 write) raises the
    one-line error of :func:`write_failed`; HDF5's complaints about the objects it can no
    longer free are kept off stderr."""
    path = Path(path)
    stream = is_stream(path)
    caught: list = []
    hook = sys.unraisablehook

    def collect(unraisable):  # h5py's failed writes as it frees its objects; anything else as before
        if os_errno(unraisable.exc_value) is not None:
            caught.append(unraisable.exc_value)
        else:
            hook(unraisable)
    sys.unraisablehook = collect
    failed = False
    try:
        if make_parents and not stream:
            path.parent.mkdir(parents=True, exist_ok=True)
        # a stream's bytes gather in the system's temporary folder, a file's beside it (to be renamed over it)
        fd, tmp = tempfile.mkstemp(prefix="attattr-out-" if stream else f".{path.name}.", suffix=suffix,
                                   dir=None if stream else path.parent)
        os.close(fd)
        try:
            # h5py prints the failures of the objects it frees after a failed write itself:
            # what the block prints is held and passed on only when nothing failed
            held = io.StringIO()
            with contextlib.redirect_stderr(held):
                yield Path(tmp)
            if caught or "errno = " in held.getvalue():  # h5py: a write that failed as its objects were freed
                raise caught[0] if caught else RuntimeError(held.getvalue())
            sys.stderr.write(held.getvalue())
            if stream:
                with open(tmp, "rb") as fh, open_stream(path) as target:
                    shutil.copyfileobj(fh, target)
            else:
                os.chmod(tmp, 0o666 & ~umask())  # what ``open`` gives a new file
                os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    except (OSError, RuntimeError) as exc:
        if not isinstance(exc, OSError) and os_errno(exc) is None and not caught:
            raise  # the writer's own error, not a failed write: theirs to say
        failed = True
        with contextlib.redirect_stderr(io.StringIO()):
            caught.clear()
        raise write_failed(exc, path) from None
    finally:
        if not failed:
            sys.unraisablehook = hook


@contextlib.contextmanager
def writing(path):
    """Around a writer that is not fileio's own (save_pretrained, safetensors): a write that
    fails for lack of space, or an OSError, is the one line of :func:`write_failed` naming
    ``path``; other errors pass."""
    try:
        yield
    except AttattrError:
        raise
    except Exception as exc:
        if isinstance(exc, OSError) or os_errno(exc) in FULL:
            raise write_failed(exc, path) from None
        raise


def write_atomic(path: str | os.PathLike, data: str | bytes, make_parents: bool = False) -> None:
    """Write ``data`` through a temporary file in the same folder and rename it over ``path``
    (a symbolic link at ``path`` is replaced by the file, its target left as it is)."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if is_stream(path):  # a device, a FIFO, /dev/stdout: written in place, never replaced
        try:
            with open_stream(path) as fh:
                fh.write(raw)
        except OSError as exc:
            raise write_failed(exc, path) from None
        return
    folder = path.parent
    if make_parents:
        folder.mkdir(parents=True, exist_ok=True)
    if not folder.exists():
        raise OptionError(f"cannot write {path}: the folder {folder} does not exist")
    if path.is_dir() and not path.is_symlink():
        raise OptionError(f"cannot write {path}: it is a directory")
    try:
        with replaced(path, make_parents=False) as tmp:
            tmp.write_bytes(raw)
    except OSError as exc:
        raise write_failed(exc, path) from None


def strict_json(obj):
    """``obj`` with NaN and infinities as None (numpy scalars and arrays as Python's), so that
    it is strict JSON: what JSON.parse and other readers accept."""
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
    """``obj`` as strict JSON (one trailing newline), written atomically."""
    write_atomic(path, dumps(obj, indent=indent, **dump) + "\n", make_parents=make_parents)


def dumps(obj, **kwargs) -> str:
    """``json.dumps`` of :func:`strict_json` (NaN and infinities as null), never a bare NaN
    or Infinity: every JSON attattr prints or writes goes through here."""
    kwargs.pop("allow_nan", None)
    return json.dumps(strict_json(obj), allow_nan=False, **kwargs)


def temp_dir_for(out: str | os.PathLike) -> Path:
    """A fresh hidden folder beside ``out`` to build a result folder in (a device or a FIFO
    at ``out`` is refused: a folder cannot be streamed)."""
    out = Path(out)
    if is_stream(out):
        raise OptionError(f"cannot write the folder {out}: it is a device or a FIFO, not a folder")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    except OSError as exc:
        raise write_failed(exc, out) from None


def swap_dir_in(tmp: Path, out: str | os.PathLike) -> None:
    """Move the complete folder ``tmp`` to ``out``, its folders and files given the usual
    modes (it is a result written by attattr, nothing in it executable); an existing
    ``out`` is moved aside first and removed only after the new one is in place (a symbolic
    link there, dangling or not, is replaced: its target is left as it is)."""
    out = Path(out)
    files, folders = 0o666 & ~umask(), 0o777 & ~umask()  # what ``open`` and ``mkdir`` give
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
