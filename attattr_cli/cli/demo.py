"""`attattr demo`: the built-in synthetic task and its model."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import Command, Group, edge, err, out, progress_bar, renamed_options

app = typer.Typer(help="The built-in synthetic task and default model.", no_args_is_help=True, cls=Group)


@app.command("train", cls=Command)
def train(
    out_dir: Path = typer.Option(Path("default_model"), "--out", "-o", help="Folder to write the model to."),
    seed: int = typer.Option(0, "--seed", help="Training seed."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder (only once training succeeded)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary on stderr."),
) -> None:
    """Retrain the default model (a small BERT on the synthetic task) on CPU."""
    with edge():
        from ..api.demo import train_default

        with progress_bar("train", quiet) as bar:
            metrics = train_default(out_dir, seed=seed, overwrite=overwrite, progress=bar)
        if not quiet:
            err.print(
                f"held-out accuracy {metrics['heldout_accuracy']:.4f} after {metrics['train_seconds']:.1f} s "
                f"({metrics['n_params']} parameters)",
                markup=False,
            )
        out.print(str(out_dir), markup=False)


@app.command("data", cls=Command)
def data(
    out_file: Path = typer.Option(..., "--out", "-o", help="TSV file to write."),
    count: int = typer.Option(200, "--count", help="Number of examples."),
    seed: int = typer.Option(1, "--seed", help="Generator seed."),
) -> None:
    """Write synthetic examples (premise, hypothesis, label, planted pair) as TSV."""
    with edge():
        from ..api.demo import synthetic_data

        with renamed_options("out", "count"):
            written = synthetic_data(out_file, count=count, seed=seed)
        out.print(str(written), markup=False)
