"""A browsable, offline HTML report of a store (docs/views.md, "attattr report"): one file
(``report.html``, every example inline) or a folder (``DIR/index.html`` plus
``DIR/examples/NNNNNNNN.js``, each loaded when its row is clicked). No printing; progress goes
to a callback.
"""

from __future__ import annotations

import html
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..errors import OptionError
from .data import ViewSpec
from .html import script_json, static, view_data
from ..fileio import dumps as strict_dumps, is_stream, swap_dir_in, temp_dir_for, write_atomic, write_failed
from .still import report_still

MAX_SINGLE_FILE = 1000  # examples; above this a report is a folder
RESIDUAL_FLAG = 0.1  # a layer's |residual| above this share of the largest |f(x) - f(baseline)| is flagged
EXAMPLE_DIGITS = 3
PROVENANCE_KEYS = ("model", "model_class", "model_type", "weights_sha256", "task", "data", "data_sha256",
                   "label_names", "options", "kernel", "device", "dtype", "store_dtype", "libraries", "command")


@dataclass
class ReportResult:
    path: Path
    folder: bool
    examples: int
    bytes: int
    flagged: dict


def _text(e) -> str:
    return e.text_a if e.text_b is None else f"{e.text_a} ‖ {e.text_b}"


COLUMNS = ["index", "text", "gold", "prediction", "probability", "max |residual|", "tokens", "flags"]
# a store of generations scored step by step: one row per prompt and its generated tokens
GENERATION_COLUMNS = ["index", "prompt", "generated", "steps", "foil", "max |step residual|", "tokens", "flags"]


def _large_residual(e) -> bool:
    """Whether some layer's |residual| exceeds RESIDUAL_FLAG of the largest |f(x) - f(baseline)| (and 1% of |f(x)|)."""
    resid = np.abs(np.asarray(e.residual, dtype=np.float64)).ravel()
    spread = np.abs(float(getattr(e, "f_full", 0.0)) - np.asarray(getattr(e, "f_baseline", np.zeros_like(resid)),
                                                                    dtype=np.float64).ravel())
    limit = max(RESIDUAL_FLAG * float(spread.max(initial=0.0)), 0.01 * abs(float(getattr(e, "f_full", 0.0))), 1e-12)
    return bool(resid.size and np.any(resid > limit))


def row_of(e, labels: Sequence[str]) -> dict:
    """One example's row by column name: index, text, gold, prediction, probability, max
    |residual|, tokens, flags; a generation's also prompt, generated (its words), steps, foil
    and max |step residual| (the largest of a step and layer), flagged by its steps."""
    from .data import header_of

    h = header_of(e, labels)
    resid = np.abs(np.asarray(e.residual, dtype=np.float64)).ravel()
    steps = getattr(e, "steps", None)
    flags = [flag for flag, on in (("wrong", h.get("correct") is False and not steps),
                                   ("residual", any(map(_large_residual, steps)) if steps else _large_residual(e)),
                                   ("truncated", h.get("truncated")),
                                   ("unconverged", any(st.unconverged_layers for st in steps) if steps
                                    else h.get("unconverged"))) if on]
    prob = h.get("probability") if h.get("probability_of") == f"p({h['prediction']})" else None  # of the prediction
    row = {"index": int(e.index), "text": _text(e), "gold": h.get("gold"), "prediction": h["prediction"],
           "probability": None if prob is None else round(prob, 4),
           "max |residual|": float(f"{resid.max():.3g}") if resid.size else None, "tokens": len(e.tokens),
           "flags": flags, "prompt": _text(e), "generated": h["prediction"], "steps": None, "foil": None,
           "max |step residual|": None}
    if steps:
        from .steps import facts

        f = facts(e)
        row.update({"generated": f["generated"], "steps": f["steps"], "foil": f["foil"],
                    "max |step residual|": None if f["max_residual"] is None else float(f"{f['max_residual']:.3g}")})
    return row


def _provenance(store) -> dict:
    prov = store.provenance
    out = {k: prov[k] for k in PROVENANCE_KEYS if k in prov}
    root = store.root_attrs
    out["schema"] = f"{root.get('schema')} {root.get('schema_version')}"
    out["written by"] = f"attattr {root.get('attattr_version')} on {root.get('created')}"
    out["runs"] = len(prov.get("runs") or [])
    if isinstance(out.get("command"), list):
        out["command"] = " ".join(map(str, out["command"]))
    return {k: v if isinstance(v, str) else strict_dumps(v) for k, v in out.items()}


def _importance(path, store) -> dict:
    from ..analysis.importance import read

    imp = read(path)
    theirs, ours = imp.identity.weights_sha256, store.provenance.get("weights_sha256")
    if ours and theirs and theirs != ours:
        raise OptionError(f"--importance {path} was made for another model (weights sha256 {theirs[:12]}…;"
                          f" {Path(store.path).name}: {str(ours)[:12]}…)")
    return {"model": imp.identity.model, "file": Path(path).name,
            "tables": [{"name": t.name, "description": t.description,
                        "values": np.round(np.asarray(t.values, dtype=np.float64), 6).tolist()}
                       for t in imp.tables.values()]}


def page(data: dict, title: str, examples: str = "") -> str:
    """The report page; ``examples`` (the inline examples' script elements) goes in as it is,
    never through a text replacement that could reach into the data."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{html.escape(title)}</title>
<style>{static("view.css")}</style></head>
<body class="aa-report"><div id="aa-report">{report_still(data)}</div>
<script type="application/json" id="aa-report-data">{script_json(data)}</script>
<script>{static("view.js")}</script>
<script>{static("report.js")}</script>
{examples}
<script>AttattrReport.start(document.getElementById("aa-report"), JSON.parse(document.getElementById("aa-report-data").textContent));</script>
</body></html>
"""


def is_folder_target(out: str | Path) -> bool:
    s = str(out)
    if is_stream(s):  # /dev/stdout, a FIFO: the single file, streamed
        return False
    return s.endswith(("/", "\\")) or Path(s).is_dir() or not Path(s).suffix


def build_report(store, out: str | Path, importance: str | Path | None = None, family: str | None = None,
                 spec: ViewSpec | None = None, progress: Callable[[int, int, str], None] | None = None) -> ReportResult:
    """Write the report of an open ``Store`` to ``out`` (a .html file, or a folder when ``out``
    ends with a slash, is a folder or has no suffix); written whole or not at all."""
    from . import from_store

    folder = is_folder_target(out)
    out = Path(out)
    if not out.parent.exists():
        raise OptionError(f"-o {out}: the folder {out.parent} does not exist")
    if not folder and out.suffix.lower() not in (".html", ".htm") and not is_stream(out):
        raise OptionError(f"-o {out}: give a .html file or a folder (DIR/)")
    if folder and out.exists():
        if not out.is_dir():
            raise OptionError(f"-o {out}: a file of that name exists; give a folder name (DIR/) or a .html file")
        names = {p.name for p in out.iterdir()}
        if names and not (names <= {"index.html", "examples"} and "index.html" in names):
            raise OptionError(f"-o {out} is a folder that holds other files, not an attattr report:"
                              " give a new folder name (it is replaced whole when it holds a report)")
    indices = store.indices()
    if not indices:
        raise OptionError(f"{store.path} holds no examples")
    if not folder and len(indices) > MAX_SINGLE_FILE:
        raise OptionError(f"{store.path} holds {len(indices):,} examples, too many for one file (at most"
                          f" {MAX_SINGLE_FILE:,}): write a folder instead, -o {out.with_suffix('')}/")
    imp = _importance(importance, store) if importance is not None else None
    spec = spec or ViewSpec()
    fams = store.families()
    if family is not None and family not in fams:
        raise OptionError(f"{store.path} has no attention family '{family}'; it has: {', '.join(fams)}")
    prov = store.provenance
    rows, flagged = [], {"wrong": 0, "residual": 0, "truncated": 0, "unconverged": 0}
    generations: dict = {}  # what a store of generations says once: the target per step, the steps
    tmp = temp_dir_for(out) if folder else None
    inline: list[str] = []
    try:
        if tmp is not None:
            (tmp / "examples").mkdir()
        for k, i in enumerate(indices):
            loaded = from_store(store, i, family=family, provenance=prov)
            e, labels = loaded.example, loaded.labels
            spec.num_layers = loaded.num_layers
            row = row_of(e, labels)
            rows.append(row)
            for f in row["flags"]:
                flagged[f] += 1
            if getattr(e, "steps", None):  # a generation: its text, step x source matrix and steps, as HTML
                from .steps import facts, step_still

                data = {"steps_html": step_still(e, details=True)}
                generations.setdefault("target", facts(e)["target"])
                generations["steps"] = generations.get("steps", 0) + len(e.steps)
                generations["examples"] = generations.get("examples", 0) + 1
            else:
                data = view_data(e, labels, spec, loaded.token_importance, per_head=False, digits=EXAMPLE_DIGITS)
            text = script_json(data)
            if tmp is not None:
                (tmp / "examples" / f"{i:08d}.js").write_text(f"AttattrReport.example({i},{text});\n", encoding="utf-8")
            else:
                inline.append(f'<script type="application/json" id="aa-ex-{i}">{text}</script>')
            if progress:
                progress(k + 1, len(indices), f"example {i}")
        columns = ([c for c in GENERATION_COLUMNS if c != "foil" or any(r["foil"] is not None for r in rows)]
                   if generations else COLUMNS)
        data = {"title": Path(store.path).name, "provenance": _provenance(store), "labels": labels,
                "columns": columns, "rows": [[r[c] for c in columns] for r in rows],
                "generations": generations or None, "mode": "folder" if folder else "inline",
                "family": family or (fams[0] if fams else "self"), "families": fams, "importance": imp,
                "flagged": flagged, "residual_flag": RESIDUAL_FLAG}
        title = f"attattr report: {Path(store.path).name}"
        if tmp is not None:
            (tmp / "index.html").write_text(page(data, title), encoding="utf-8")
            swap_dir_in(tmp, out)
            tmp = None
            size = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
            path = out / "index.html"
        else:
            body = page(data, title, "\n".join(inline))
            write_atomic(out, body)
            size, path = len(body.encode("utf-8")), out
    except OSError as exc:  # the folder's files: a full disk, a file size limit
        raise write_failed(exc, out) from None
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return ReportResult(path, folder, len(indices), size, flagged)

