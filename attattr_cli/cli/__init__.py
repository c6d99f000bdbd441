"""The `attattr` command line: thin commands over the library."""

from __future__ import annotations

import typer

from .. import __version__
from . import demo
from .info import info
from .merge import merge
from .score import score
from .tree import tree
from .import_json import import_json
from .finetune import finetune
from .importance import importance
from .prune import prune
from .triggers import triggers
from .attack import attack
from .faithfulness import faithfulness
from . import report, view

app = typer.Typer(
    name="attattr",
    help="Self-attention attribution (Hao et al., AAAI 2021) for transformers models, into HDF5 stores.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
app.command("score")(score)
app.command("info")(info)
app.command("merge")(merge)
app.command("tree")(tree)
app.command("import-json")(import_json)
app.command("finetune")(finetune)
app.command("importance")(importance)
app.command("prune")(prune)
app.command("triggers")(triggers)
app.command("attack")(attack)
app.command("faithfulness")(faithfulness)
app.add_typer(demo.app, name="demo")
app.command("view")(view.view); app.command("report")(report.report)  # noqa: E702


def _version(value: bool):
    if value:
        print(f"attattr {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True, help="Print the version.")):
    """Self-attention attribution for transformers models."""


def main() -> None:
    app()
