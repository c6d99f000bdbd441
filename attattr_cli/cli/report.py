"""`attattr report`: a browsable, offline HTML report of a store."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import edge, err, out, progress_bar, renamed_options


def report(
    store: Path = typer.Argument(..., help="An attattr HDF5 store (from `attattr score`)."),
    out_path: str = typer.Option(..., "--out", "-o", help="report.html (one self-contained file) or DIR/ (a folder: index.html and one script per example; for large stores)."),
    importance: Optional[Path] = typer.Option(None, "--importance", help="An importance file (from `attattr importance`): its head importance heatmaps go on the page."),
    family: Optional[str] = typer.Option(None, "--family", help="Attention family of an encoder-decoder store: encoder (default), decoder or cross."),
    quiet: bool = options.quiet("No progress bar and no summary on stderr."),
) -> None:
    """Write a report of a whole store: provenance, a sortable and filterable table of the
    examples (text, gold, prediction, probability, residual, flags; for generations the prompt,
    generated words, steps, foil and worst step residual) and each example's view (a
    generation's step x source matrix and steps) one click away. Offline: the CSS and JavaScript are in the page, nothing is fetched."""
    with edge():
        from ..api.views import report as write_report

        with progress_bar("report", quiet) as bar, renamed_options("out"):
            result = write_report(store, out_path, importance=importance, family=family, progress=bar)
        if not quiet:
            kind = "folder" if result.folder else "file"
            f = result.flagged
            err.print(f"{result.examples} examples ({f['wrong']} wrong, {f['residual']} with a large residual,"
                      f" {f['truncated']} truncated, {f['unconverged']} not converged); {result.bytes / 1e6:.1f} MB {kind}",
                      markup=False)
        out.print(str(result.path), markup=False)
