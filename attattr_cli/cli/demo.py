"""`attattr demo`: the built-in synthetic task and its model."""

from __future__ import annotations

from pathlib import Path

import typer

from .common import Command, Group, edge, err, out, progress_bar

app = typer.Typer(help="The built-in synthetic task and default model.", no_args_is_help=True, cls=Group)


@app.command("train", cls=Command)
def train(
    out_dir: Path = typer.Option(Path("default_model"), "--out", "-o", help="Folder to write the model to."),
    seed: int = typer.Option(0, "--seed", help="Training seed."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no summary on stderr."),
) -> None:
    """Retrain the default model (a small BERT on the synthetic task) on CPU."""
    with edge():
        from ..models.default import train_default_model

        with progress_bar("train", quiet) as bar:
            metrics = train_default_model(out_dir, seed=seed, progress=lambda s, t, info: bar(s, t, f"loss {info.get('loss', 0):.3f}" if "loss" in info else ""))
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
        from ..data import synthetic

        if out_file.exists():
            from ..errors import OptionError

            raise OptionError(f"{out_file} exists; it was left as it is (choose another --out)")
        synthetic.write(out_file, synthetic.generate(count, seed))
        out.print(str(out_file), markup=False)
