"""`attattr demo`: the built-in synthetic task and its model."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..api.demo import PAIR_TASKS
from ..errors import OptionError
from . import options
from .common import Command, Group, edge, err, out, progress_bar, renamed_options

app = typer.Typer(help="The built-in synthetic task and default model.", no_args_is_help=True, cls=Group)


@app.command("train", cls=Command)
def train(
    out_dir: Path = typer.Option(Path("default_model"), "--out", "-o", help="Folder to write the model to."),
    seed: int = typer.Option(0, "--seed", help="Training seed."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder (only once training succeeded)."),
    threads: Optional[int] = options.threads("torch's CPU threads while training (default: 2)."),
    quiet: bool = options.quiet("No progress bar and no summary on stderr."),
) -> None:
    """Retrain the default model (a small BERT on the synthetic task) on CPU."""
    with edge():
        from ..api.demo import train_default

        with progress_bar("train", quiet) as bar:
            metrics = train_default(out_dir, seed=seed, overwrite=overwrite, progress=bar, threads=threads)
        if not quiet:
            err.print(
                f"held-out accuracy {metrics['heldout_accuracy']:.4f} after {metrics['train_seconds']:.1f} s "
                f"({metrics['n_params']} parameters)",
                markup=False,
            )
        out.print(str(out_dir), markup=False)


@app.command("data", cls=Command)
def data(
    out_file: Path = typer.Option(..., "--out", "-o", help="File to write: TSV (synthetic) or JSONL (pair tasks)."),
    task: str = typer.Option("synthetic", "--task", help="synthetic (premise, hypothesis, label, planted pair; TSV), or a"
                             " counterfactual pair task for --model's tokenizer (JSONL of prompt, counterfactual, answer,"
                             " foil): " + ", ".join(PAIR_TASKS) + "."),
    model: Optional[str] = options.model("With a pair task: the model folder or hub id whose tokenizer the pairs are"
                                         " made for (only its tokenizer is read)."),
    count: Optional[int] = typer.Option(None, "--count", help="Number of examples (default 200 synthetic, 100 pairs)."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Generator seed (default 1 synthetic, 0 pairs)."),
) -> None:
    """Write examples of a built-in task: synthetic examples as TSV, or clean / counterfactual
    prompt pairs of a registered pair task (attattr methods 'demo data' lists them) as JSONL for a
    model's tokenizer."""
    with edge():
        from ..api.demo import pair_data, pair_tasks, synthetic_data

        if task not in ("synthetic",) + pair_tasks():
            raise OptionError(f"unknown --task '{task}'; available: {', '.join(('synthetic',) + pair_tasks())}")
        with renamed_options("out", "count", "model", "task"):
            if task == "synthetic":
                if model is not None:
                    raise OptionError("--model goes with a pair task (--task " + "|".join(PAIR_TASKS) + ")")
                written = synthetic_data(out_file, count=200 if count is None else count, seed=1 if seed is None else seed)
            else:
                written = pair_data(out_file, task=task, model=model, count=100 if count is None else count,
                                    seed=0 if seed is None else seed)
        out.print(str(written), markup=False)
