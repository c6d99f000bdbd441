"""`attattr prune`: pruning curves, the effectiveness analysis, and really pruned models."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from ..fileio import write_json
from .common import TASK_HELP, command_line, edge, err, out, parse_int_list, progress_bar
from .importance import load_model_data



def prune(
    out_path: Path = typer.Option(..., "--out", "-o", help="CURVES.json to write (replaced only once complete)."),
    importance_path: Optional[Path] = typer.Option(None, "--importance", "-i", help="Importance file from attattr importance: one curve per method in it."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Local model folder or hub id (default: the built-in synthetic-task BERT)."),
    data: Optional[str] = typer.Option(None, "--data", "-d", help="Evaluation TSV, CSV or JSONL (default: the built-in synthetic held-out set)."),
    task: Optional[str] = typer.Option(None, "--task", "-t", help=TASK_HELP),
    examples: Optional[str] = typer.Option(None, "--examples", "-e", help="Evaluation rows, e.g. 0:500 (default: all)."),
    rates: str = typer.Option("0:1:0.1", "--rates", help="Fractions of all heads to prune: start:stop:step (stop included) or a list."),
    methods: Optional[str] = typer.Option(None, "--methods", help="Only these methods of the importance file (comma list; default: all)."),
    batch_size: int = typer.Option(64, "--batch-size", help="Examples per forward pass."),
    keep: Optional[float] = typer.Option(None, "--keep", help="With --save-model: the fraction of heads to keep (the most important by --keep-method)."),
    save_model: Optional[Path] = typer.Option(None, "--save-model", help="Write a really pruned model folder (BERT-family encoders)."),
    keep_method: Optional[str] = typer.Option(None, "--keep-method", help="Table that ranks heads for --keep (default: attr, else the first in the file)."),
    effectiveness: Optional[Path] = typer.Option(None, "--effectiveness", help="A store of the model on --data: run the paper's per-example effectiveness analysis on its examples."),
    ks: Optional[str] = typer.Option(None, "--ks", help="Heads pruned per layer in the effectiveness analysis (default 2,4,...,all)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu, cuda or cuda:N."),
    truncate: bool = typer.Option(False, "--truncate", help="Cut inputs longer than the model's maximum instead of refusing them."),
    plot: Optional[Path] = typer.Option(None, "--plot", help="Draw the curves (and the effectiveness analysis) into FILE.png or FILE.svg."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar."),
) -> None:
    """Mask the least important heads at each rate and evaluate, for every method of an importance file.

    One global ranking of all heads per method; every method against the same unpruned
    baseline; random tables averaged. With --keep and --save-model, also save a model with
    the heads really removed. Prints the CURVES.json path on stdout.
    """
    with edge():
        from ..analysis import importance as imp
        from ..analysis import prune as pr
        from ..engine.heads import Batches
        from ..errors import OptionError

        if importance_path is None and effectiveness is None:
            raise OptionError("nothing to do: give --importance IMP.h5 (curves) and/or --effectiveness STORE")
        if (keep is None) != (save_model is None):
            raise OptionError("--keep and --save-model go together")
        if keep is not None and importance_path is None:
            raise OptionError("--keep needs --importance to rank the heads")
        rate_list = pr.parse_rates(rates)
        imp_file = imp.read(importance_path) if importance_path is not None else None
        loaded, task_obj, picked, label_map, all_examples = load_model_data(model, data, task, examples, device)
        if imp_file is not None:
            imp.check_model(imp_file, loaded)
        task_name = task_obj.name if task_obj else None
        ident = imp.identity_of(loaded)
        result: dict = {
            "model": ident.model, "weights_sha256": ident.weights_sha256, "model_type": ident.model_type,
            "task": task_name or "generic", "data": data or "builtin", "examples": examples or "all",
            "importance": str(importance_path) if importance_path else None, "command": command_line(),
        }
        batches = Batches(loaded, picked, label_map, batch_size, truncate)
        if imp_file is not None:
            wanted = [m.strip() for m in methods.split(",")] if methods else None
            with progress_bar("prune", quiet) as bar:
                result["curves"] = pr.curves(loaded, batches, imp_file, rate_list, task_name, wanted, bar)
            _report_curves(result["curves"])
        if effectiveness is not None:
            result["effectiveness"] = _effectiveness(loaded, effectiveness, all_examples, picked, label_map, ks,
                                                     batch_size, truncate, task_name, quiet)
            _report_effectiveness(result["effectiveness"])
        if save_model is not None:
            result["pruned_model"] = _save(loaded, imp_file, keep, keep_method, save_model, batches)
        write_json(out_path, result, make_parents=True)
        if plot is not None:
            from ..analysis.plots import prune_figure

            prune_figure(result, plot, title=f"{ident.model} on {task_name or 'data'}")
            err.print(f"plot: {plot}", markup=False)
        out.print(str(out_path), markup=False)


def _report_curves(c: dict) -> None:
    from rich.table import Table

    metric = c["metric"]
    t = Table(title=f"{metric} with the least important heads masked ({c['n_examples']} examples; "
                    f"unpruned {c['baseline'][metric]:.4f})", show_edge=False)
    t.add_column("pruned", justify="right")
    for name in c["methods"]:
        t.add_column(name, justify="right")
    for i, r in enumerate(c["rates"]):
        t.add_row(f"{r:.0%}", *[f"{c['methods'][n][metric][i]:.4f}" for n in c["methods"]])
    err.print(t)


def _report_effectiveness(e: dict) -> None:
    from rich.table import Table

    t = Table(title=f"effectiveness: accuracy (mean over layers) with k heads per layer pruned per example "
                    f"({e['n_examples']} examples; unpruned {e['baseline_accuracy']:.4f})", show_edge=False)
    t.add_column("order")
    for k in e["ks"]:
        t.add_column(f"k={k}", justify="right")
    for name, entry in e["orders"].items():
        t.add_row(name.replace("_", " "), *[f"{a:.4f}" for a in entry["accuracy"]])
    err.print(t)


def _effectiveness(loaded, store_path, all_examples, picked, label_map, ks, batch_size, truncate, task_name, quiet):
    import numpy as np

    from ..analysis import prune as pr
    from ..engine.heads import Batches
    from ..engine.run import data_digest
    from ..errors import StoreError
    from ..store import Store

    with Store(store_path) as st:
        fp = st.fingerprint
        if fp.get("weights_sha256") != loaded.weights_sha256:
            raise StoreError(f"{store_path} was scored with another model than --model (weights differ)")
        if fp.get("data_sha256") not in (None, data_digest(all_examples)):
            raise StoreError(f"{store_path} was scored on other data than --data; give the data it was scored on")
        wanted = {e.index for e in picked}
        idx = [i for i in st.indices() if i in wanted]
        if not idx:
            raise StoreError(f"{store_path} holds none of the selected examples")
        L, H = loaded.arch.num_layers, loaded.arch.num_heads
        attr = np.zeros((len(idx), L, H))
        attn = np.zeros((len(idx), L, H))
        from ..analysis.importance import store_family

        family = store_family(st)  # self or encoder: the heads attattr can mask
        for n, i in enumerate(idx):
            e = st.get(i, family=family)
            if list(e.layers) != list(range(L)):
                raise StoreError(f"{store_path} scored layers {e.layers}; the effectiveness analysis needs every layer")
            if e.attention is None or np.ndim(e.attention) != 4:
                raise StoreError(f"{store_path} keeps no per-head attention maps (scored with --keep sum or none);"
                                 " the effectiveness analysis needs them: score with --keep maps")
            attr[n] = e.head_max
            attn[n] = np.asarray(e.attention, np.float64).reshape(L, H, -1).max(-1)
    by_index = {e.index: e for e in all_examples}
    chosen = [by_index[i] for i in idx]
    k_list = parse_int_list(ks, "--ks") or list(range(2, H + 1, 2)) or [H]
    if k_list[-1] != H and ks is None:
        k_list.append(H)
    batches = Batches(loaded, chosen, label_map, batch_size, truncate)
    with progress_bar("effectiveness", quiet) as bar:
        return pr.effectiveness(loaded, batches, attr, attn, k_list, task_name, bar) | {"store": str(store_path)}


def _save(loaded, imp_file, keep, keep_method, save_model, batches) -> dict:
    import torch

    from ..analysis import prune as pr
    from ..engine.heads import logits_under
    from ..errors import OptionError

    names = list(imp_file.tables)
    name = keep_method or ("attr" if "attr" in names else names[0])
    if name not in imp_file.tables:
        raise OptionError(f"--keep-method {name}: {imp_file.path} has {', '.join(names)}")
    values = imp_file.tables[name].values
    kept = pr.kept_heads(values, keep)
    pr.check_sliceable(loaded.model)
    pr.save_pruned(loaded.model, loaded.tokenizer, kept, save_model,
                   extra={"keep": keep, "method": name, "importance": imp_file.path})
    reloaded = pr.load_pruned(save_model).to(next(loaded.model.parameters()).device)
    mask = pr.mask_at(values, 1 - keep)
    masked = logits_under(loaded, batches, mask)
    with torch.no_grad():
        real = torch.empty_like(masked)
        for b in batches.batches:
            real[b.positions] = reloaded(**b.inputs).logits.float().cpu()
    diff = float((masked - real).abs().max()) if masked.numel() else 0.0
    full_params, pruned_params = pr.count_params(loaded.model), pr.count_params(reloaded)
    t_full = pr.time_forward(loaded.model, batches)
    t_pruned = pr.time_forward(reloaded, batches)
    info = {
        "folder": str(save_model), "method": name, "keep": keep,
        "heads_kept": sum(len(k) for k in kept), "heads_total": int(values.size), "kept_heads": kept,
        "params_unpruned": full_params, "params_pruned": pruned_params,
        "seconds_unpruned": t_full, "seconds_pruned": t_pruned, "speedup": t_full / t_pruned if t_pruned else None,
        "max_abs_logit_diff_vs_masked": diff,
        "agreement_vs_masked": float((masked.argmax(-1) == real.argmax(-1)).float().mean()) if masked.numel() else 1.0,
    }
    err.print(
        f"pruned model: {save_model}: {info['heads_kept']}/{info['heads_total']} heads by {name}, "
        f"{pruned_params:,} parameters vs {full_params:,} ({pruned_params / full_params:.1%}); one pass over "
        f"{batches.n} examples {t_pruned:.2f} s vs {t_full:.2f} s unpruned ({info['speedup']:.2f}x); "
        f"max |logit - masked logit| {diff:.1e}",
        markup=False,
    )
    return info
