"""`attattr info`: what a store holds."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from . import options
from .common import edge, out
from ..api.inputs import strict_dumps  # strict JSON: no NaN or Infinity


def _families(fams: dict) -> str:
    """One line per attention family: layers x heads, what is kept, residual."""
    lines = []
    for name, d in fams.items():
        axes = f"{d.get('query')}->{d.get('key')}"
        topk = f", top-{d['top_k']}" if d.get("top_k") else ""
        resid = "" if d.get("mean_abs_residual") is None else f", mean |residual| {d['mean_abs_residual']:.1e}"
        conv = ""
        if d.get("nodes_mean") is not None:
            conv = f", nodes mean {d['nodes_mean']:.1f} (max {d['nodes_max']})"
            if d.get("error_estimate_max") is not None:
                conv += (f", error estimate max {d['error_estimate_max']:.1e} (median {d['error_estimate_median']:.1e})"
                         " of max |Attr|")
        lines.append(f"{name}: {len(d.get('layers') or [])} layers scored x {d.get('heads')} heads ({axes}),"
                     f" keep {d.get('keep')}{topk}{resid}{conv}")
        lines.append(f"  {_convergence(d)}")
    return "\n".join(lines)


def _convergence(d: dict) -> str:
    """How many example-layers converged, and where the others are, with why."""
    states = d.get("convergence") or {}
    total = sum(states.values())
    if not total or set(states) == {"not checked"}:
        return "convergence: not checked (a store written before schema 1.3)"
    tol = d.get("convergence_tol")
    at = f" at tol {tol:g}" if tol is not None else ""
    bad = d.get("unconverged") or 0
    unit = d.get("counted") or "example-layers"  # a store of generations counts its steps' integrals
    if not bad:
        return f"convergence{at}: all {total} {unit} converged (estimate and completeness residual agree)"
    why = ", ".join(f"{n} {k}" for k, n in sorted(states.items()) if k not in ("converged", "not checked") and n)
    where = d.get("unconverged_at") or []
    steps = unit == "step-layers"
    shown = ", ".join(f"{w['example']}/{w['step']}/{w['layer']}" if steps else f"{w['example']}/{w['layer']}"
                      for w in where[:8]) + (", ..." if len(where) > 8 else "")
    return (f"convergence{at}: {bad} of {total} {unit} NOT converged ({why});"
            f" {'example/step/layer' if steps else 'example/layer'}: {shown}")


def _flagged(indices: list[int]) -> str:
    if not indices:
        return "none"
    shown = ", ".join(str(i) for i in indices[:10]) + (", ..." if len(indices) > 10 else "")
    return f"{len(indices)} example{'s' if len(indices) != 1 else ''} with NaN or inf, skipped by every analysis ({shown})"


def _not_attention(fams: dict) -> list[tuple[str, str]]:
    """A hybrid's layers that compute no softmax attention (not scored), one row per family."""
    rows = []
    for name, d in fams.items():
        skip = d.get("not_attention") if isinstance(d, dict) else None
        if skip:
            rows.append((f"not attention ({name})", ", ".join(f"{i} {kind}" for i, kind in skip.items())))
    return rows


def info(
    store: Path = typer.Argument(..., help="An attattr HDF5 store."),
    as_json: bool = options.as_json("Print JSON instead of a table."),
) -> None:
    """Print what a store holds: model, options, examples, accuracy, completeness residuals."""
    with edge():
        from ..api.views import info as store_info

        summary = store_info(store)
        if as_json:
            out.print(strict_dumps(summary, indent=2, default=str), markup=False)
            return
        prov = summary.pop("provenance")
        table = Table(title=f"attattr store {store}", show_header=False, title_justify="left")
        table.add_column("key", style="bold")
        table.add_column("value")
        rows = [
            ("schema", f"{summary.get('schema')} {summary.get('schema_version')}"),
            ("written by", f"attattr {summary.get('attattr_version')} on {summary.get('created')}"),
            ("model", f"{prov.get('model')} ({prov.get('model_class')}, {prov.get('num_layers')} layers x {prov.get('num_heads')} heads)"),
            ("weights sha256", str(prov.get("weights_sha256"))),
            ("task / data", f"{prov.get('task') or 'generic'} / {prov.get('data')}"),
            ("labels", ", ".join(prov.get("label_names") or [])),
            ("options", strict_dumps(prov.get("options"), sort_keys=True)),
            ("kernel / device", f"{prov.get('kernel')} / {prov.get('device')}"),
            ("examples", f"{summary['examples']} (indices {summary['first_index']}..{summary['last_index']})"
             if summary["examples"] else "0 complete (an interrupted run; the next score run into this store resumes it)"),
            ("non-finite", _flagged(summary["nonfinite_examples"])),
            ("tokens", "" if summary["tokens_min"] is None else f"{summary['tokens_min']}..{summary['tokens_max']} (mean {summary['tokens_mean']:.1f})"),
            ("accuracy", "" if summary["accuracy"] is None else f"{summary['accuracy']:.4f} on {summary['with_gold']} with gold labels"),
            ("mean |residual| per layer", "" if summary["mean_abs_residual_per_layer"] is None else
             " ".join(f"{r:.1e}" for r in summary["mean_abs_residual_per_layer"])),
            ("families", _families(summary.get("families") or {})),
            *_not_attention(prov.get("families") or {}),
            ("runs", str(len(prov.get("runs") or []))),
            ("size", f"{summary['size_bytes'] / 1e6:.2f} MB"),
        ]
        gen = summary.get("generations")
        if gen:  # a generation attributed step by step (schema 1.4)
            rows.append(("generations", f"{gen['examples']} example{'s' if gen['examples'] != 1 else ''},"
                         f" {gen['steps_total']} steps (at most {gen['steps_max']} per example);"
                         f" max |residual| per step and layer {gen['step_abs_residual_max']:.1e};"
                         f" {gen['step_layers_unconverged']} step-layers unconverged (the families row counts the same)"))
        if summary.get("cut_short"):
            rows.append(("damaged", "cut short by a write that failed (a full disk): the examples shown lie wholly"
                                    " within the file; the next score run with space recovers them"))
        for k, v in rows:
            table.add_row(k, v)
        out.print(table)
