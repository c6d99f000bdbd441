"""Typer options shared by the commands, declared once: the model and data options, the
device, the threads, quiet, and the table formats. Each is a function so that a command can word the help
for its own use; the names and short forms are the same everywhere (see docs/api.md)."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import OptionError
from .common import TASK_HELP, out
from ..api.inputs import strict_dumps  # strict JSON: no NaN or Infinity

MODEL_HELP = "Local model folder or hub id (default: the built-in synthetic-task BERT)."
DATA_HELP = "TSV, CSV or JSONL file (default: the built-in synthetic held-out set)."
EXAMPLES_HELP = "Indices and ranges, e.g. 0:100 or 3,7,9 (default: all)."
THREADS_HELP = "torch's threads for the run (default: 1 below 256 tokens, else the cores free now; engine/threads.py)."


def model(help: str = MODEL_HELP) -> Optional[str]:
    return typer.Option(None, "--model", "-m", help=help)


def data(help: str = DATA_HELP) -> Optional[str]:
    return typer.Option(None, "--data", "-d", help=help)


def task() -> Optional[str]:
    return typer.Option(None, "--task", "-t", help=TASK_HELP)


def examples(help: str = EXAMPLES_HELP) -> Optional[str]:
    return typer.Option(None, "--examples", "-e", help=help)


def device() -> str:
    return typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N.")


def truncate() -> bool:
    return typer.Option(False, "--truncate", help="Cut inputs longer than the model's maximum instead of refusing them.")


def threads(help: str = THREADS_HELP) -> Optional[int]:
    return typer.Option(None, "--threads", help=help)


def quiet(help: str = "No progress bar and no tables or summary on stderr.") -> bool:
    return typer.Option(False, "--quiet", "-q", help=help)


def as_json(help: str = "Print the table on stdout as JSON (instead of the output's path).") -> bool:
    return typer.Option(False, "--json", help=help)


def as_csv(help: str = "Print the table on stdout as CSV (instead of the output's path).") -> bool:
    return typer.Option(False, "--csv", help=help)


def hidden(name: str):
    """An old spelling kept as a hidden alias."""
    return typer.Option(None, name, hidden=True)


def once(value, alias, name: str, alias_name: str):
    """An option given under its name or its old spelling (not both)."""
    if value is not None and alias is not None and value != alias:
        raise OptionError(f"give {name} once ({alias_name} is its old spelling)")
    return value if value is not None else alias


def pick(new, old, default=None):
    """The value of an option given under its new name or its old (hidden) one."""
    if old is not None and (new is None or new == default):
        return old
    return new


def print_rows(rows: list[dict], fmt: str) -> None:
    """Rows on stdout as JSON (a list of objects) or CSV (a header and one line per row)."""
    if fmt == "json":
        out.file.write(strict_dumps(rows, indent=2, ensure_ascii=False, default=_plain) + "\n")
        return
    import csv
    import io

    buf = io.StringIO()
    keys = list(dict.fromkeys(k for r in rows for k in r))
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in keys})
    out.file.write(buf.getvalue())


def _plain(x):
    try:
        return x.tolist()
    except AttributeError:
        return str(x)
