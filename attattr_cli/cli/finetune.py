"""`attattr finetune`: turn an encoder into a sequence classifier for a task."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from . import options
from .common import command_line, edge, err, out, progress_bar


def finetune(
    out_dir: Path = typer.Option(..., "--out", "-o", help="Model folder to write (written under a temporary name, then renamed)."),
    model: Optional[str] = options.model("Local model folder: a bare encoder (e.g. a BertModel) or a classifier (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = options.data("Training TSV, CSV or JSONL (default: the built-in synthetic training set)."),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples("Training rows to use, e.g. 0:10000 (default: all)."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Use at most the first N selected training rows."),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Evaluation file, same columns (default: none; the synthetic held-out set for the built-in task)."),
    epochs: float = typer.Option(1.0, "--epochs", help="Passes over the training rows (fractions allowed)."),
    lr: float = typer.Option(1e-4, "--lr", help="Peak learning rate (AdamW, linear decay to 0)."),
    warmup: float = typer.Option(0.0, "--warmup", help="Fraction of the steps with linear warm-up."),
    batch_size: int = typer.Option(32, "--batch-size", help="Examples per step."),
    max_length: int = typer.Option(128, "--max-length", help="Tokens per input (longer inputs are cut)."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings/--train-embeddings", help="Keep the embedding layer fixed (faster, less memory)."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay (not on biases and LayerNorm)."),
    threads: Optional[int] = options.threads("torch's CPU threads while training (default: torch's own count)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the new head, the batch order and dropout."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder (only once training succeeded)."),
    quiet: bool = options.quiet(),
) -> None:
    """Fine-tune a sequence classifier and save a standard model folder (save_pretrained + tokenizer).

    With no --model and no --data it fine-tunes the built-in default model on the synthetic
    task's training set and evaluates on its held-out set. Prints the folder on stdout.
    """
    with edge():
        from ..api import finetune as run

        with progress_bar("finetune", quiet) as bar:
            report = run(model, out=out_dir, data=data, task=task, examples=examples, eval_data=eval_data,
                         max_examples=max_examples, epochs=epochs, lr=lr, warmup=warmup, batch_size=batch_size,
                         max_length=max_length, freeze_embeddings=freeze_embeddings, weight_decay=weight_decay,
                         threads=threads or 0, seed=seed, overwrite=overwrite, progress=bar, command=command_line())
        if not quiet:
            acc = "" if report.eval_accuracy is None else f"; eval accuracy {report.eval_accuracy:.4f} on {report.eval_examples} examples"
            err.print(
                f"fine-tuned on {report.train_examples} examples ({report.steps} steps) in {report.train_seconds:.1f} s"
                f"{acc}; final loss {report.final_loss:.3f}",
                markup=False,
            )
        out.print(str(out_dir), markup=False)
