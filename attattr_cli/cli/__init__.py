"""The `attattr` command line: thin commands over the library.

Importing this module must stay quick (no torch, no transformers): commands that need them
import them when they run, so `attattr --help`, `--version`, `info`, `tree`, `merge` and
`triggers STORE` start in a fraction of a second (tests/test_startup.py checks it).
"""

from __future__ import annotations

import typer

from .. import __version__
from . import demo
from .attack import attack
from .circuit import circuit
from .common import EXIT_CODES_HELP, Command, Group
from .convert import convert
from .faithfulness import faithfulness
from .finetune import finetune
from .import_json import import_json
from .importance import importance
from .info import info
from .merge import merge
from .methods import methods
from .prune import prune
from .score import score
from .sources_check import sources_check
from .tree import tree
from .triggers import triggers
from . import report, view

app = typer.Typer(
    name="attattr",
    help="Self-attention attribution (Hao et al., AAAI 2021) for transformers models, into HDF5 stores.",
    epilog=EXIT_CODES_HELP,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    cls=Group,
)
for _name, _command in (("score", score), ("info", info), ("merge", merge), ("tree", tree),
                        ("import-json", import_json), ("finetune", finetune), ("importance", importance),
                        ("prune", prune), ("triggers", triggers), ("attack", attack),
                        ("faithfulness", faithfulness), ("circuit", circuit), ("view", view.view),
                        ("report", report.report), ("convert", convert), ("sources-check", sources_check),
                        ("methods", methods)):
    app.command(_name, cls=Command)(_command)
app.add_typer(demo.app, name="demo", cls=Group)


def _version(value: bool):
    if value:
        print(f"attattr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")):
    """Self-attention attribution for transformers models."""
    ignore_file_size_signal()


def ignore_file_size_signal() -> None:
    """A write past the file size limit (``ulimit -f``) fails with EFBIG, said in one line
    (exit status 5), instead of SIGXFSZ ending the process."""
    import signal

    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def main() -> None:
    import warnings

    # a library warning (unknown words, the memory back-off) is one "Warning: ..." line on stderr
    warnings.formatwarning = lambda message, category, filename, lineno, line=None: f"Warning: {message}\n"
    ignore_file_size_signal()
    app()
