"""A circuit result as HDF5 (schema ``attattr.circuit`` 1.0; docs/circuits.md)::

    /                      attrs: schema, schema_version, attattr_version, created, model,
                           metric, ablation, pairs, layers, heads, m_clean, m_empty, recommended
    /percentages           float64 [10]
    /split/fit, /split/eval   int64: the pairs (indices into the input) the methods saw and those
                           the curve is measured on; attrs kind, seed, same_pairs (MIB's protocol)
    /methods/<name>/scores    float64 [layer, node] (mean over pairs; nodes: the heads, and with
                           nodes "heads+mlp" the layer's MLP as the last column)
    /methods/<name>/per_pair  float64 [pair, layer, head]
    /methods/<name>/curve     float64 [10] (signed ranking), curve_abs [10] (absolute ranking)
                           attrs: cpr, cmd, cpr_interval, cmd_interval, cpu_s_per_pair,
                           spearman_patching, top10_shared, completeness (NaN where not computed)
"""

from __future__ import annotations

from datetime import datetime, timezone

import numpy as np

SCHEMA = "attattr.circuit"
SCHEMA_VERSION = "1.0"


def _nan(x):
    return np.nan if x is None else x


def write(path, result) -> None:
    import h5py

    from ... import __version__
    from ...fileio import replaced

    with replaced(path, suffix=".h5") as tmp:
        with h5py.File(tmp, "w") as f:
            a = f.attrs
            a.update({"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "attattr_version": __version__,
                      "created": datetime.now(timezone.utc).isoformat(), "model": result.model,
                      "metric": result.metric, "ablation": result.ablation, "pairs": result.n_pairs,
                      "layers": result.layers, "heads": result.heads, "nodes": result.nodes,
                      "m_clean": result.clean,
                      "m_empty": result.empty, "recommended": result.recommended})
            f["percentages"] = np.asarray(result.percentages, dtype=np.float64)
            if result.split:  # MIB's protocol: the pairs the methods saw, and those the curve is measured on
                g = f.create_group("split")
                g.attrs.update({"kind": result.split["kind"], "seed": result.split["seed"],
                                "same_pairs": bool(result.split["same_pairs"])})
                g["fit"] = np.asarray(result.split["fit"], dtype=np.int64)
                g["eval"] = np.asarray(result.split["eval"], dtype=np.int64)
            for name, r in result.methods.items():
                g = f.create_group(f"methods/{name}")
                g["scores"] = np.asarray(r.scores, dtype=np.float64)
                g.create_dataset("per_pair", data=np.asarray(r.per_pair, dtype=np.float64), compression="gzip",
                                 shuffle=True)
                g["curve"] = np.asarray(r.curve, dtype=np.float64)
                g["curve_abs"] = np.asarray(r.curve_abs, dtype=np.float64)
                g.attrs.update({"cpr": r.cpr, "cmd": r.cmd, "cpr_interval": np.asarray(r.cpr_interval),
                                "cmd_interval": np.asarray(r.cmd_interval), "cpu_s_per_pair": r.cpu_s_per_pair,
                                "spearman_patching": _nan(r.spearman), "top10_shared": _nan(r.top10_shared),
                                "completeness": _nan(r.completeness)})
