"""`attattr importance`: head importance tables into IMP.h5, a heatmap, a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from .common import TASK_HELP, command_line, edge, err, out, parse_int_list, progress_bar


def load_model_data(model, data, task, examples, device="auto"):
    """(loaded model, task, picked examples, label map) the way `score` resolves them."""
    from ..data import parse_examples
    from ..engine.run import resolve_inputs
    from ..models.loading import align_labels, load

    model_id, task_obj, all_examples, labels = resolve_inputs(model, data, task)
    chosen = parse_examples(examples, len(all_examples))
    loaded = load(model_id, device=device)
    label_map, _ = align_labels(labels, loaded)
    return loaded, task_obj, [all_examples[i] for i in chosen], label_map, all_examples


def importance(
    store: Optional[Path] = typer.Argument(None, help="An attribution store (attattr score) for --method attr / attention."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Importance file (HDF5) to write; an existing one for the same model gets the new tables added."),
    method: Optional[str] = typer.Option(None, "--method", help="attr, attention (from STORE), taylor, random (from --model/--data); a comma list (default: attr,attention with a store, taylor,random without)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local model folder or hub id (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="TSV, CSV or JSONL file (default: the built-in synthetic held-out set)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help=TASK_HELP),
    examples: Optional[str] = typer.Option(None, "--examples", "-e", help="Examples to average over, e.g. 0:200 (data rows; store indices with a STORE). Default: all."),
    seeds: str = typer.Option("0,1,2", "--seeds", help="Seeds of the random tables (one table random-SEED each)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Examples per forward/backward pass (taylor)."),
    no_normalize: bool = typer.Option(False, "--no-normalize", help="Taylor: keep the raw values (default: unit L2 norm per layer, as Michel et al.)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    truncate: bool = typer.Option(False, "--truncate", help="Cut inputs longer than the model's maximum instead of refusing them."),
    family: Optional[str] = typer.Option(None, "--family", help="With a STORE of an encoder-decoder model: the attention family (encoder; decoder and cross heads cannot be masked, so they are refused). Default: the store's first."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the tables as heatmaps into FILE.png or FILE.svg."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no heatmap."),
) -> None:
    """Rank attention heads: attribution (E_x max Attr_h, from a store), attention, Taylor, random.

    With no STORE, --model and --data give Taylor and random tables; with neither, the
    built-in default model and synthetic task. Prints the importance file's path on stdout.
    """
    with edge():
        from ..analysis import importance as imp
        from ..errors import OptionError

        seed_list = parse_int_list(seeds, "--seeds") or [0]
        tables = []
        if store is not None:
            from ..store import Store

            if model is not None or data is not None or task is not None:
                raise OptionError("give either a STORE or --model/--data/--task, not both")
            methods = imp.parse_methods(method or "attr,attention", imp.STORE_METHODS + ("random",))
            with Store(store) as st:
                chosen = parse_int_list(examples, "--examples") if examples else None
                wanted = [m for m in methods if m in imp.STORE_METHODS]
                with progress_bar("importance", quiet) as bar:
                    ident, tables = imp.from_store(st, wanted, chosen, bar, family=family)
        else:
            if family is not None:
                raise OptionError("--family goes with a STORE; with --model, Taylor importance covers the heads"
                                  " attattr masks (self-attention, or the encoder of an encoder-decoder model)")
            methods = imp.parse_methods(method or "taylor,random", imp.MODEL_METHODS)
            if "taylor" in methods:
                loaded, task_obj, picked, label_map, _ = load_model_data(model, data, task, examples, device)
            else:
                from ..models.loading import load
                from ..engine.run import resolve_inputs

                model_id, _, _, _ = resolve_inputs(model, data, task)
                loaded, picked = load(model_id, device=device), []
            ident = imp.identity_of(loaded)
            if "taylor" in methods:
                with progress_bar("taylor", quiet) as bar:
                    t = imp.taylor(loaded, picked, label_map, batch_size, not no_normalize, truncate, bar)
                t.source = f"{data or 'builtin'}"
                tables.append(t)
        if "random" in methods:
            tables.extend(imp.random_table(ident.num_layers, ident.num_heads, s) for s in seed_list)
        written = imp.write(out_path, ident, tables, command_line())
        if not quiet:
            for t in tables:
                if t.method == "random" and t.seed != seed_list[0]:
                    continue
                err.print(heatmap(t))
        if plot is not None:
            from ..analysis.plots import importance_heatmaps

            importance_heatmaps(list(written.tables.values()), plot, title=ident.model)  # every table, every seed
            err.print(f"plot: {plot}", markup=False)
        err.print(f"{out_path}: tables {', '.join(written.tables)} for {ident.describe()}", markup=False)
        out.print(str(out_path), markup=False)


def heatmap(table):
    """A rich table: layers as rows, heads as columns; each cell its value in % of the table's
    largest |value|, coloured by its rank (red: least important, blue: most)."""
    import numpy as np
    from rich.table import Table as RichTable
    from rich.text import Text

    v = np.asarray(table.values, float)
    L, H = v.shape
    order = v.ravel().argsort(kind="stable").argsort(kind="stable").reshape(L, H) / max(v.size - 1, 1)
    top = float(np.abs(v).max()) or 1.0
    rt = RichTable(title=f"{table.name}: {table.description}" + (f" ({len(table.examples)} examples)" if table.examples else "")
                   + f"; cells in % of {top:.3g}", show_edge=False, pad_edge=False, padding=(0, 0), collapse_padding=True)
    rt.add_column("L\\H", justify="right")
    for h in range(H):
        rt.add_column(str(h), justify="right", min_width=4)
    for layer in range(L):
        cells = []
        for h in range(H):
            r = order[layer, h]
            red, blue = int(255 * (1 - r)), int(255 * r)
            cells.append(Text(f"{100 * v[layer, h] / top:4.0f}",
                              style=f"black on rgb({80 + red * 2 // 3},{80 + min(red, blue) // 2},{80 + blue * 2 // 3})"))
        rt.add_row(str(layer), *cells)
    return rt
