"""`attattr importance`: head importance tables into IMP.h5, a heatmap, a picture."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.table import Table
from rich.text import Text

from . import options
from .common import command_line, edge, err, out, parse_int_list, progress_bar, renamed_options, store_notes


def importance(
    store: Optional[Path] = typer.Argument(None, help="An attribution store (attattr score) for --methods attr / attention."),
    out_path: Path = typer.Option(..., "--out", "-o", help="Importance file (HDF5) to write; an existing one for the same model gets the new tables added."),
    methods: Optional[str] = typer.Option(None, "--methods", help="attr, attention (from STORE), taylor, random (from --model/--data); with --data a JSONL of pairs also every head method of attattr circuit (atp, nap-ig, atp-verified, patching, ...); a comma list (default: attr,attention with a store, taylor,random without)."),
    method_old: Optional[str] = options.hidden("--method"),
    model: Optional[str] = options.model(),
    data: Optional[str] = options.data(),
    task: Optional[str] = options.task(),
    examples: Optional[str] = options.examples("Examples to average over, e.g. 0:200 (data rows; store indices with a STORE). Default: all."),
    seeds: str = typer.Option("0,1,2,3,4", "--seeds", help="Seeds of the random tables (one table random-SEED each; five by default, so that prune draws the random orders' band over five)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Examples per forward/backward pass (taylor)."),
    no_normalize: bool = typer.Option(False, "--no-normalize", help="Taylor: keep the raw values (default: unit L2 norm per layer, as Michel et al.)."),
    device: str = options.device(),
    threads: Optional[int] = options.threads(),
    truncate: bool = options.truncate(),
    family: Optional[str] = typer.Option(None, "--family", help="With a STORE of an encoder-decoder model: the attention family (encoder; decoder and cross heads cannot be masked, so they are refused). Default: the store's first."),
    metric: Optional[str] = typer.Option(None, "--metric", help="With --data a JSONL of clean / counterfactual pairs and --model a causal language model: Taylor takes the gradient of each pair's logit-diff (the default), logprob-diff or prob."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Also draw the tables as heatmaps into FILE.png or FILE.svg."),
    as_json: bool = options.as_json(),
    as_csv: bool = options.as_csv(),
    quiet: bool = options.quiet(),
) -> None:
    """Rank attention heads: attribution (E_x max Attr_h, from a store), attention, Taylor, random.

    With no STORE, --model and --data give Taylor and random tables; with neither, the
    built-in default model and synthetic task. Prints the importance file's path on stdout
    (--json/--csv: the tables, one row per layer and head).
    """
    with edge():
        from ..api import importance as run

        seed_list = parse_int_list(seeds, "--seeds") or [0]
        with progress_bar("importance", quiet) as bar, renamed_options("methods", "out"):
            result = run(store, model=model, data=data, task=task, examples=examples,
                         methods=options.pick(methods, method_old), seeds=seed_list, batch_size=batch_size,
                         normalize=not no_normalize, truncate=truncate, family=family, device=device, out=out_path,
                         progress=bar, command=command_line(), metric=metric, threads=threads)
        tables = list(result.tables.values())
        store_notes(result.skipped_nonfinite, result.unconverged, result.used)
        first_random = min((t.seed for t in tables if t.method == "random" and t.seed is not None), default=None)
        shown = [t for t in tables if not (t.method == "random" and t.seed not in (None, first_random))]
        if not quiet and not (as_json or as_csv):
            for t in shown:
                err.print(heatmap(t))
                if getattr(t, "stability", None) and t.stability.get("examples", 0) >= 2:
                    err.print(stability_line(t), markup=False)
        if plot is not None:
            result.plot(plot)
            if not quiet:
                err.print(f"plot: {plot}", markup=False)
        if not quiet:
            err.print(f"{out_path}: tables {', '.join(result.tables)} for {result.identity.describe()}", markup=False)
        if as_json or as_csv:
            rows = [{"table": t.name, "layer": layer, "head": h, "value": float(t.values[layer, h]),
                     "rank": int(rank_of(t.values)[layer, h]), **_rank_cells(t, layer, h)}
                    for t in tables for layer in range(t.values.shape[0]) for h in range(t.values.shape[1])]
            options.print_rows(rows, "json" if as_json else "csv")
        else:
            out.print(str(out_path), markup=False)


def rank_of(values):
    """Rank of every head (1 = most important)."""
    v = np.asarray(values, float)
    return np.argsort(np.argsort(-v.ravel(), kind="stable")).reshape(v.shape) + 1  # the stable order's inverse


def _rank_cells(t, layer, h) -> dict:
    st = getattr(t, "stability", None)
    if not st:
        return {"rank_low": None, "rank_high": None, "tau_halves": None}
    lo, hi = float(st["rank_low"][layer][h]), float(st["rank_high"][layer][h])
    ok = lo == lo and hi == hi  # NaN with fewer than two examples
    return {"rank_low": lo if ok else None, "rank_high": hi if ok else None, "tau_halves": st.get("tau_halves")}


def stability_line(t) -> str:
    """The ranking's stability in two lines: tau between halves, rank intervals of the top heads."""
    st = t.stability
    lo, hi = np.asarray(st["rank_low"]), np.asarray(st["rank_high"])
    ranks = rank_of(t.values)
    width = float(np.median(hi - lo))
    top = [tuple(int(x) for x in np.argwhere(ranks == k)[0]) for k in range(1, min(5, ranks.size) + 1)]
    tau = st.get("tau_halves")
    return (f"  {t.name} ranking over {st['examples']} examples: Kendall tau between two random halves "
            f"{'-' if tau is None else f'{tau:.2f}'}; {st['level']:.0%} bootstrap rank intervals, median width "
            f"{width:.0f} ranks; top heads " + ", ".join(f"L{a}H{b} [{lo[a, b]:.0f}, {hi[a, b]:.0f}]" for a, b in top))


def heatmap(table):
    """A rich table: layers as rows, heads as columns; each cell its value in % of the table's
    largest |value|, coloured by its rank (red: least important, blue: most)."""
    v = np.asarray(table.values, float)
    L, H = v.shape
    order = v.ravel().argsort(kind="stable").argsort(kind="stable").reshape(L, H) / max(v.size - 1, 1)
    top = float(np.abs(v).max()) or 1.0
    rt = Table(title=f"{table.name}: {table.description}" + (f" ({len(table.examples)} examples)" if table.examples else "")
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
