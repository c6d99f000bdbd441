"""`attattr finetune`: turn an encoder into a sequence classifier for a task."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import TASK_HELP, command_line, edge, err, out, progress_bar


def finetune(
    out_dir: Path = typer.Option(..., "--out", "-o", help="Model folder to write (written under a temporary name, then renamed)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local model folder: a bare encoder (e.g. a BertModel) or a classifier (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Training TSV, CSV or JSONL (default: the built-in synthetic training set)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help=TASK_HELP[:-1] + " (columns and label names)."),
    examples: Optional[str] = typer.Option(None, "--examples", "-e", help="Training rows to use, e.g. 0:10000 (default: all)."),
    max_examples: Optional[int] = typer.Option(None, "--max-examples", help="Use at most the first N selected training rows."),
    eval_data: Optional[str] = typer.Option(None, "--eval-data", help="Evaluation file, same columns (default: none; the synthetic held-out set for the built-in task)."),
    epochs: float = typer.Option(1.0, "--epochs", help="Passes over the training rows (fractions allowed)."),
    lr: float = typer.Option(1e-4, "--lr", help="Peak learning rate (AdamW, linear decay to 0)."),
    warmup: float = typer.Option(0.0, "--warmup", help="Fraction of the steps with linear warm-up."),
    batch_size: int = typer.Option(32, "--batch-size", help="Examples per step."),
    max_length: int = typer.Option(128, "--max-length", help="Tokens per input (longer inputs are cut)."),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings/--train-embeddings", help="Keep the embedding layer fixed (faster, less memory)."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay (not on biases and LayerNorm)."),
    threads: int = typer.Option(0, "--threads", help="Torch CPU threads while training (0: the default)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the new head, the batch order and dropout."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty --out folder (only once training succeeded)."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Fine-tune a sequence classifier and save a standard model folder (save_pretrained + tokenizer).

    With no --model and no --data it fine-tunes the built-in default model on the synthetic
    task's training set and evaluates on its held-out set. Prints the folder on stdout.
    """
    with edge():
        from ..data import get_task, load_examples, parse_examples
        from ..data import synthetic
        from ..engine.finetune import FinetuneOptions, check_out
        from ..engine.finetune import finetune as run_finetune
        from ..errors import OptionError
        from ..models.default import DEFAULT_MODEL_DIR

        check_out(out_dir, overwrite)
        if model is None and data is None and task is None:
            task = "synthetic"
        task_obj = get_task(task) if task else None
        if task_obj is not None and task_obj.builtin:
            if data is not None:
                raise OptionError("--task synthetic trains on the built-in set; leave out --data")
            model = model or str(DEFAULT_MODEL_DIR)
            train_all = synthetic.train_set(2000)
            labels = tuple(synthetic.LABELS)
            evals = synthetic.heldout() if eval_data is None else None
        else:
            if data is None:
                raise OptionError("--model needs --data (a training file), or leave out both for the built-in task")
            if model is None:
                raise OptionError("--data needs --model (a local model folder to fine-tune)")
            train_all, labels = load_examples(data, task_obj)
            evals = None
        if eval_data is not None:
            evals, _ = load_examples(eval_data, task_obj, list(labels))
        chosen = parse_examples(examples, len(train_all))
        if max_examples is not None:
            if max_examples < 1:
                raise OptionError("--max-examples must be >= 1")
            chosen = chosen[:max_examples]
        train = [train_all[i] for i in chosen]
        options = FinetuneOptions(
            epochs=epochs, lr=lr, batch_size=batch_size, max_length=max_length,
            freeze_embeddings=freeze_embeddings, weight_decay=weight_decay, warmup=warmup,
            seed=seed, threads=threads,
        )
        provenance = {"task": task_obj.name if task_obj else "generic", "data": data or "builtin",
                      "eval_data": eval_data or ("builtin" if evals else ""), "command": command_line()}
        with progress_bar("finetune", quiet) as bar:
            report = run_finetune(model, train, labels, out_dir, options, evals, bar, overwrite, provenance)
        acc = "" if report.eval_accuracy is None else f"; eval accuracy {report.eval_accuracy:.4f} on {report.eval_examples} examples"
        err.print(
            f"fine-tuned on {report.train_examples} examples ({report.steps} steps) in {report.train_seconds:.1f} s"
            f"{acc}; final loss {report.final_loss:.3f}",
            markup=False,
        )
        out.print(str(out_dir), markup=False)
