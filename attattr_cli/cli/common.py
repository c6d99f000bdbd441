"""What every command shares: the error edge, the stderr console, progress bars, parsers."""

from __future__ import annotations

import contextlib
import os
import sys
import time

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..data.tasks import TASKS
from ..errors import AttattrError, OptionError

err = Console(stderr=True, highlight=False, soft_wrap=True, emoji=False)  # ":100:" stays as typed
out = Console(highlight=False, soft_wrap=True, emoji=False)

# --task's help in every command, from the task registry (a new preset shows up everywhere)
TASK_HELP = "Task preset: " + ", ".join(TASKS) + "."


@contextlib.contextmanager
def edge():
    """Turn library errors into one line on stderr and a non-zero exit, no traceback."""
    try:
        yield
    except AttattrError as exc:
        if getattr(exc, "collective", False) and os.environ.get("RANK", "0") != "0":
            # every torchrun rank has it and rank 0 says it; leave rank 0 time to, before
            # torchrun stops the others on this rank's exit
            time.sleep(3)
            raise typer.Exit(exc.exit_code) from None
        err.print(f"Error: {exc}", markup=False)
        raise typer.Exit(exc.exit_code) from None
    except KeyboardInterrupt:
        err.print("Interrupted: what was written is kept; run the same command again to resume.", markup=False)
        raise typer.Exit(130) from None


@contextlib.contextmanager
def progress_bar(description: str, quiet: bool = False):
    """A rich progress bar on stderr, drawn from the first update on (so an error
    raised before any work leaves stderr with its one line); yields a callback
    (done, total, label)."""
    state: dict = {}

    def update(done: int, total: int, label: str) -> None:
        if quiet:
            return
        if "bar" not in state:
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
        state["bar"].update(state["task"], completed=done, total=total, label=label)

    try:
        yield update
    finally:
        if "bar" in state:
            state["bar"].stop()


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
