"""What every command shares: the error edge and exit codes, the stderr console, progress
(a rich bar on a terminal, plain lines otherwise), help without type tags on flags, parsers."""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time

import typer
from rich.console import Console
from typer.core import TyperCommand, TyperGroup

from ..api.inputs import TASKS
from ..errors import AttattrError, OptionError
from ..names import cli_text, cli_words


_SURROGATE = re.compile("[\ud800-\udfff]")


def printable(text: str) -> str:
    """``text`` as any UTF-8 stream takes it: the undecodable bytes of a file name or a stored
    string (held by Python as lone surrogates) shown as ``\\xNN``, other lone surrogates as
    ``\\uNNNN``, instead of an encoding error in the middle of a line."""

    def escape(m: re.Match) -> str:
        code = ord(m.group())
        return f"\\x{code - 0xDC00:02x}" if 0xDC80 <= code <= 0xDCFF else f"\\u{code:04x}"

    return _SURROGATE.sub(escape, text)


class _Stream:
    """``sys.stdout`` or ``sys.stderr`` as it is at each write (a test runner or a notebook
    swaps them), taking only printable text: a write that raised would leave rich's buffer
    full, and every later print would raise again."""

    def __init__(self, name: str):
        self._name = name

    def write(self, text: str) -> int:
        return getattr(sys, self._name).write(printable(text))

    def __getattr__(self, attr: str):
        return getattr(getattr(sys, self._name), attr)


def console(stream: str = "stdout", **kwargs) -> Console:
    """A console on stdout or stderr that prints any text (see ``printable``); markup and
    emoji codes off by default (":100:" stays as typed)."""
    return Console(file=_Stream(stream), **{"highlight": False, "soft_wrap": True, "emoji": False, **kwargs})


err = console("stderr")
out = console("stdout")


def wide_err() -> Console:
    """The stderr console for wide tables: a terminal's own width; 200 columns when stderr
    is a pipe or a log file (rich's 80 would squeeze the columns to a few letters)."""
    return err if err.is_terminal else console("stderr", width=200)


# exit statuses: the AttattrError classes' exit_code, Typer's usage errors (2) and Ctrl-C
EXIT_CODES = {
    0: "success",
    1: "other error",
    2: "bad data or options",
    3: "model cannot be loaded or is not supported",
    4: "store missing, damaged or made otherwise",
    5: "out of memory or disk space (a full disk, a quota, a file size limit)",
    6: "torchrun processes failed or disagree",
    130: "interrupted (what was written is kept)",
}
EXIT_CODES_HELP = "Exit codes: " + "; ".join(f"{code} {what}" for code, what in EXIT_CODES.items()) + "."

# seconds between plain progress lines when stderr is not a terminal (a log file, a pipe)
PLAIN_EVERY = 10.0

# --task's help in every command, from the task registry (a new preset shows up everywhere)
TASK_HELP = "Task preset: " + ", ".join(TASKS.built_in()) + "."

# what Ctrl-C leaves, said on interruption: a command that writes as it goes and resumes (score)
INTERRUPTED = "what was written is kept; run the same command again to resume."


@contextlib.contextmanager
def edge(interrupted=INTERRUPTED):
    """Turn library errors into one line on stderr and a non-zero exit, no traceback.
    ``interrupted``: what the command's Ctrl-C leaves, as it is for that command (a command
    that writes only at the end says that nothing was written); a text, or a function that
    says it at the moment of the interruption."""
    try:
        with cli_words():  # the library's messages keep the flags
            yield
    except AttattrError as exc:
        if getattr(exc, "template", None) is not None:  # an argument's check: its flag instead
            exc.args = (cli_text(exc),)
        if getattr(exc, "collective", False) and os.environ.get("RANK", "0") != "0":
            # every torchrun rank has it and rank 0 says it; leave rank 0 time to, before
            # torchrun stops the others on this rank's exit
            time.sleep(3)
            raise typer.Exit(exc.exit_code) from None
        err.print(f"Error: {exc}", markup=False)
        if getattr(exc, "end_process", False):
            # a failed HDF5 write (a full disk) leaves HDF5's state in this process unusable:
            # its shutdown would crash; the file keeps what its last flush wrote
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(exc.exit_code)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print(f"Interrupted: {interrupted() if callable(interrupted) else interrupted}", markup=False)
        raise typer.Exit(130) from None
    except Exception as exc:  # a write without room, from any writer (h5py, safetensors, open): one line
        from ..api.inputs import FULL, no_space, os_errno

        code = os_errno(exc)
        if code not in FULL:
            raise
        # every output is written beside its target and renamed over it: the old file is intact
        error = no_space(getattr(exc, "filename", None) or "the output", code)
        err.print(f"Error: {error}", markup=False)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(error.exit_code)  # HDF5's state after a failed write would crash its shutdown


# the API's arguments (of one word, or several) that the commands' messages rename to their flags
# (the flags: attattr_cli/names.py, the one table of arguments and flags)
FLAGS = ("importance", "effectiveness", "keep_heads", "save_model", "batch_size", "top_k", "out", "save_texts",
         "rank_by", "family", "compat", "methods", "tol")


@contextlib.contextmanager
def renamed_options(*arguments: str):
    """OptionErrors raised inside by the API name its arguments (``keep_heads``); the command's
    user knows them as flags (``--keep-heads``): each of ``arguments`` is renamed to its flag
    (attattr_cli.names), and an argument's check names its flag wherever it is raised."""
    try:
        yield
    except OptionError as exc:
        text = cli_text(exc, arguments)
        if text != str(exc):
            exc.args = (text,)
            exc.template = None
        raise


def store_notes(skipped: int | None, unconverged: int | None, used: int | None) -> None:
    """The stderr lines of an analysis that left out store examples holding NaN or inf, or used
    examples whose integral the store calls not converged."""
    if skipped:
        err.print(f"skipped {skipped} example{'s' if skipped != 1 else ''} flagged 'nonfinite' in the store (NaN or"
                  f" inf in {'their' if skipped != 1 else 'its'} scores)", markup=False)
    if unconverged:
        err.print(f"note: {unconverged} of the {used} example{'s' if used != 1 else ''} used"
                  f" {'have' if unconverged != 1 else 'has'} a layer whose integral the store calls not converged"
                  " (attattr info lists them; rescore with a smaller --tol or a larger --max-nodes)", markup=False)


def read_prompt_file(path) -> str:
    """The whole text of ``--prompt-file`` (UTF-8)."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise OptionError(f"--prompt-file {path}: cannot read it ({exc.__class__.__name__})") from None


def p_text(p: float | None, none: str = "-") -> str:
    """A p-value in a table cell: two significant digits, scientific below 0.001."""
    return none if p is None else (f"{p:.2g}" if p >= 0.001 else f"{p:.1e}")


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class _PlainProgress:
    """Progress as plain lines on stderr, one every ``every`` seconds and one at the end:
    ``score: 40/200 (20%), 2.1/s, ETA 1m16s, <label>``. For a log file or a pipe, where a
    rich bar would be silent until the end (or fill the file with redraws)."""

    def __init__(self, description: str, every: float):
        self.description, self.every = description, every
        self.start = self.last = None
        self.first_done = 0
        self.state: tuple[int, int, str] | None = None
        self.printed: tuple[int, int] | None = None

    def update(self, done: int, total: int, label: str) -> None:
        now = time.monotonic()
        if self.start is None:
            self.start, self.last, self.first_done = now, now, done
        self.state = (done, total, label)
        if now - self.last >= self.every or (total and done >= total):
            self.print(now)

    def print(self, now: float) -> None:
        done, total, label = self.state
        if self.printed == (done, total):
            return
        self.last, self.printed = now, (done, total)
        elapsed = now - self.start
        rate = (done - self.first_done) / elapsed if elapsed > 0 else 0.0
        parts = [f"{self.description}: {done}/{total}" + (f" ({100 * done / total:.0f}%)" if total else "")]
        if rate > 0:
            parts.append(f"{rate:.3g}/s")
            if total and done < total:
                parts.append(f"ETA {_duration((total - done) / rate)}")
        else:
            parts.append(f"{_duration(elapsed)} elapsed")
        if label:
            parts.append(label)
        err.print(", ".join(parts), markup=False, highlight=False)

    def stop(self) -> None:
        if self.state is not None:
            self.print(time.monotonic())


@contextlib.contextmanager
def progress_bar(description: str, quiet: bool = False):
    """Progress on stderr, drawn from the first update on (so an error raised before any
    work leaves stderr with its one line); yields a callback (done, total, label). A rich bar
    when stderr is a terminal, else a plain line every PLAIN_EVERY seconds and at the end."""
    state: dict = {}

    def update(done: int, total: int, label: str) -> None:
        if quiet:
            return
        if "bar" not in state:
            if not err.is_terminal:
                state["bar"] = _PlainProgress(description, PLAIN_EVERY)
            else:
                from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn,
                                           TimeRemainingColumn)

                bar = Progress(
                    TextColumn("[bold]{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TextColumn("{task.fields[label]}"),
                    TimeElapsedColumn(),
                    TimeRemainingColumn(),
                    console=err,
                )
                bar.start()
                state["bar"] = bar
                state["task"] = bar.add_task(description, total=total, label="")
        if "task" in state:
            state["bar"].update(state["task"], completed=done, total=total, label=label)
        else:
            state["bar"].update(done, total, label)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


class _Untagged:
    def get_params(self, ctx):
        """On/off flags take no value: show no type tag (`<bool>`) beside them in help."""
        params = super().get_params(ctx)
        for p in params:
            if getattr(p, "is_flag", False) and not getattr(p, "count", False) and p.metavar is None:
                p.metavar = ""
        return params


class Group(_Untagged, TyperGroup):
    """The root and `demo` command groups (help: flags without type tags). At the root, a
    usage error (an unknown option or command, a value of the wrong type, a missing option)
    is one ``Error:`` line on stderr, as every other error is, with exit status 2."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except typer.TyperException as exc:  # Typer's (bundled Click's) usage and parameter errors
            if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help
                ctx = getattr(exc, "ctx", None)
                where = f" (see {ctx.command_path} --help)" if ctx is not None else ""
                text = exc.format_message() if hasattr(exc, "format_message") else str(exc)
                err.print(f"Error: {' '.join(text.split())}{where}", markup=False)
            sys.exit(getattr(exc, "exit_code", 2))
        except typer.Abort:
            err.print("Aborted.", markup=False)
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


# the parameters of the commands that name what they write; every other path-like parameter
# (the store, --data, --model, --importance, ...) is an input that none of these may be
OUTPUTS = ("out_path", "out_dir", "out_file", "plot", "csv_path", "json_path", "save_model", "save_texts", "store_out",
           "keep_store")
# the outputs that are folders (a model folder) or HDF5 stores written where they lie: a device
# or a FIFO there is refused before any work, as the writers would refuse it after it
NOT_STREAMED = ("out_dir", "save_model", "store_out", "keep_store")


def check_outputs(command: "Command", params: dict) -> None:
    """The output rule of every command (fileio.check_output): no output names the same file
    as an input or as another output. Run before the command does anything."""
    from ..api.inputs import check_output, is_stream

    flags = {p.name: (p.opts[0] if getattr(p, "opts", None) else p.name) for p in command.params}
    outs = [(name, value) for name, value in params.items() if name in OUTPUTS and value is not None]
    inputs = [value for name, value in params.items() if name not in OUTPUTS]
    for i, (name, value) in enumerate(outs):
        if name in NOT_STREAMED and is_stream(value):
            raise OptionError(f"{flags.get(name, name)} {value} is a device or a FIFO: give a path for a"
                              f" {'store' if 'store' in name else 'folder'}")
        # a store scored into (--store) may be resumed and then read: it is no input of the others
        check_output(value, [*inputs, *(v for _, v in outs[i + 1:])], flags.get(name, name))


class Command(_Untagged, TyperCommand):
    """Every command (help: flags without type tags; the output rule checked before it runs)."""

    def invoke(self, ctx):
        with edge():
            check_outputs(self, ctx.params)
        return super().invoke(ctx)


def parse_int_list(spec: str | None, name: str) -> list[int] | None:
    """``0,3,5:8`` -> [0, 3, 5, 6, 7] (negative single indices allowed)."""
    if spec is None or spec.strip() in ("", "all"):
        return None
    values: list[int] = []
    for piece in spec.split(","):
        piece = piece.strip()
        try:
            if ":" in piece:
                a, b = piece.split(":", 1)
                values.extend(range(int(a or 0), int(b)))
            else:
                values.append(int(piece))
        except ValueError:
            raise OptionError(f"bad {name} '{spec}': '{piece}' is neither an index nor a range such as 0:4") from None
    return values


def command_line() -> list[str]:
    return ["attattr", *sys.argv[1:]]
