"""`attattr convert`: a GGUF file as a plain transformers model folder."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from . import options
from .common import edge, err, out


def convert(
    source: Path = typer.Argument(..., help="A GGUF file (llama.cpp's format, e.g. model.Q4_1.gguf), or a folder holding one."),
    out_dir: Path = typer.Option(..., "--out", "-o", help="The model folder to write (new or empty)."),
    dtype: str = typer.Option("float32", "--dtype", help="The weights' dtype in the folder: float32, float64, bfloat16, float16."),
    quiet: bool = options.quiet(),
) -> None:
    """Write a GGUF file as a plain transformers model folder (config.json, model.safetensors, the tokenizer).

    Every weight is dequantized once, here: `--model FOLDER --lm` then loads in seconds, where
    `--model FILE.gguf --lm` dequantizes the file on every run (docs/models.md, "GGUF files").
    Prints the folder's path on stdout.
    """
    with edge():
        from ..api import convert as run

        t0 = time.perf_counter()
        done = run(source, out_dir, dtype=dtype)
        if not quiet:
            err.print(f"converted {done['gguf']} ({done['model_type']}, {done['parameters'] / 1e6:.1f} M parameters,"
                      f" {dtype}) in {time.perf_counter() - t0:.1f} s", markup=False)
        out.print(str(out_dir), markup=False)
