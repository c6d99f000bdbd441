"""What writing one scored example's maps to the store costs, against HDF5's own filter
pipeline, in one run (issue 53: the GPU scores a 128-token BERT-base example in milliseconds,
and the store must keep up).

One example of BERT-base's shape (12 layers x 12 heads, n tokens, --keep maps): its attribution
[12, 12, n, n], attention [12, 12, n, n] and head sum [12, n, n], float32, written as the store
writes them (one chunk per layer, byte shuffle + deflate level 4) by
  hdf5 filters   h5py's create_dataset(data=...): HDF5 filters every chunk on the calling thread
  attattr        store/family.py's write_family: every map's chunks filtered on a thread pool
                 (store/compress.py, one thread per core), written with write_direct_chunk
                 (the same bytes in the file)
Prints seconds per example, MB/s of map data and the ratio; --json writes the figures.

    python bench/bench_store_write.py [--ns 128 512] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from attattr_cli.store import compress  # noqa: E402
from attattr_cli.store.family import write_family  # noqa: E402


def example_maps(n: int, layers: int = 12, heads: int = 12, seed: int = 0) -> dict:
    """Maps shaped like a scored example's: attention rows that sum to 1, attributions small
    and signed, their head sum."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((layers, heads, n, n), dtype=np.float32) * 2
    attention = np.exp(logits - logits.max(-1, keepdims=True))
    attention /= attention.sum(-1, keepdims=True)
    attribution = attention * rng.standard_normal((layers, heads, n, n), dtype=np.float32) * 1e-2
    return {"attribution": attribution, "attention": attention, "head_sum": attribution.sum(1)}


def write(maps: dict, ours: bool) -> float:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "example.h5"
        t0 = time.perf_counter()
        with h5py.File(path, "w") as f:
            if ours:  # as the store writes a family: every map's chunks begun before the first is written
                write_family(f, maps, [], np.float32)
            else:
                for name, arr in maps.items():
                    f.create_dataset(name, data=arr, chunks=(1, *arr.shape[1:]), **compress.FILTERS)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    print(f"# one example's maps (12 layers x 12 heads, keep maps, float32), h5py {h5py.__version__}, "
          f"HDF5 {h5py.version.hdf5_version}, {compress.workers()} compressing threads")
    rows = []
    for n in args.ns:
        maps = example_maps(n)
        mb = sum(a.nbytes for a in maps.values()) / 2**20
        times = {}
        for ours in (False, True):
            write(maps, ours)  # warm-up (the pool's threads, the page cache)
            times[ours] = min(write(maps, ours) for _ in range(args.repeat))
        row = {"n": n, "map_mb": mb, "hdf5_filters_s": times[False], "attattr_s": times[True],
               "ratio": times[False] / times[True], "workers": compress.workers()}
        rows.append(row)
        print(f"n = {n:<5} {mb:7.1f} MB of maps: hdf5 filters {times[False]:.3f} s ({mb / times[False]:.0f} MB/s), "
              f"attattr {times[True]:.3f} s ({mb / times[True]:.0f} MB/s): {row['ratio']:.2f}x", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "cores": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
