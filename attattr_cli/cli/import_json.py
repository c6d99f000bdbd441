"""`attattr import-json`: read the 2021 reference code's outputs into a store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..api import import_2021
from . import options
from .common import command_line, edge, err, out


def import_json(
    attr_file: Path = typer.Argument(..., help="The 2021 attribution file (attr_zero_base_expI.json): JSON lines, one [heads][n][n] list per layer."),
    tokens_file: Path = typer.Argument(..., help="Its tokens file (tokens_and_pred_N.json): a JSON list (or JSON lines) of {index, tokens, pred, golden, pred_logits}."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Store to create, or to extend (same tokens file and --model)."),
    model: Optional[str] = options.model("Name of the model the 2021 run used, recorded in the store (default: unknown)."),
    example: Optional[int] = typer.Option(None, "--example", "-n", help="Index of the example in the tokens file (default: the I of attr_..._expI.json)."),
    attention: Optional[Path] = typer.Option(None, "--attention", help="The matching attention file (att_score_zero_base_expI.json); default: none, the store's attention is empty."),
    labels: Optional[str] = typer.Option(None, "--labels", help="Label names in the model's order, comma-separated (default: inferred from pred and pred_logits)."),
    store_dtype: str = typer.Option("float32", "--store-dtype", help="float32, or float16 to halve the store."),
    quiet: bool = options.quiet("No summary line on stderr."),
    example_e: Optional[int] = typer.Option(None, "-e", hidden=True, help="Old spelling of --example."),
) -> None:
    """Import one example of a 2021 AttAttr run (its attribution JSON lines and tokens file) into a store.

    Run it once per attribution file to gather several examples in one store; `attattr tree`
    then re-draws them (`--compat reference` reproduces the 2021 tree). Prints the store's path.
    """
    with edge():
        report = import_2021(attr_file, tokens_file, out_path, model=model,
                             example=options.once(example, example_e, "--example", "-e"),
                             labels=[x.strip() for x in labels.split(",")] if labels else None,
                             attention_path=attention, command=command_line(), store_dtype=store_dtype)
        if report.already and not quiet:
            err.print(f"example {report.index} is already in {report.out}; nothing written", markup=False)
        elif not quiet:
            err.print(f"imported example {report.index} ({report.n_tokens} tokens, {report.layers} layers x"
                      f" {report.heads} heads; labels {', '.join(report.labels)}, {report.label_mapping}) into"
                      f" {'a new store' if report.created else 'the store'} {report.out}", markup=False)
        out.print(report.out, markup=False)
