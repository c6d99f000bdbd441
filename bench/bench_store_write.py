"""What writing one scored example's maps to the store costs, against HDF5's own filter
pipeline, in one run (issue 53: the GPU scores a 128-token BERT-base example in milliseconds,
and the store must keep up).

One example of BERT-base's shape (12 layers x 12 heads, n tokens, --keep maps): its attribution
[12, 12, n, n], attention [12, 12, n, n] and head sum [12, n, n], float32, written as the store
writes them (one chunk per layer, byte shuffle + deflate level 4) by
  hdf5 filters   h5py's create_dataset(data=...): HDF5 filters every chunk on the calling thread
  attattr        store/family.py's write_family: every map's chunks filtered on a thread pool
                 (store/compress.py, one thread per core; ISA-L's deflate where the isal package
                 is installed, else zlib's, the same bytes as HDF5's), written with
                 write_direct_chunk
Prints seconds per example, MB/s of map data and the ratio.

Then a run of --run-examples (16) such examples at the first n through the store's writer
(StoreWriter), the scoring of each stood in for by a wait of --score-ms (a GPU's time: the host's
cores are free meanwhile), written in line (the CPU's default) and behind, on the writer's own
thread while the next example is scored (a CUDA device's default): seconds per example and the
ratio. --json writes every figure.

    python bench/bench_store_write.py [--ns 128 512] [--repeat 3] [--score-ms 20 200]
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


def example_score(index: int, maps: dict):
    """A scored example holding ``maps`` (an ExampleScore in the store's 1.0 shape)."""
    from attattr_cli.engine.results import ExampleScore

    layers, heads, n, _ = maps["attribution"].shape
    return ExampleScore(
        index=index, tokens=[f"w{i}" for i in range(n)], input_ids=np.arange(n), segment_ids=np.zeros(n, np.int64),
        gold=0, pred=0, target=0, logits=np.zeros(2, np.float32), probs=np.full(2, 0.5, np.float32),
        layers=list(range(layers)), attribution=maps["attribution"], attention=maps["attention"],
        head_max=np.abs(maps["attribution"]).max(axis=(2, 3)), f_full=0.5, f_baseline=np.zeros(layers),
        residual=np.zeros(layers), kernel="bench")


def run(maps: dict, count: int, score_s: float, behind: bool) -> float:
    """Seconds per example of ``count`` examples through StoreWriter, each 'scored' by a wait."""
    from attattr_cli.store import StoreWriter

    with tempfile.TemporaryDirectory() as folder:
        t0 = time.perf_counter()
        with StoreWriter(Path(folder) / "run.h5", {"bench": "store"}, {}, behind=behind) as writer:
            for i in range(count):
                time.sleep(score_s)
                writer.write(example_score(i, maps))
        return (time.perf_counter() - t0) / count


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ns", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--score-ms", type=float, nargs="*", default=[20.0, 200.0],
                    help="the scoring time stood in for in the run of examples (none: no run)")
    ap.add_argument("--run-examples", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    print(f"# one example's maps (12 layers x 12 heads, keep maps, float32), h5py {h5py.__version__}, "
          f"HDF5 {h5py.version.hdf5_version}, {compress.workers()} compressing threads, deflate by {compress.ENCODER}")
    rows = []
    for n in args.ns:
        maps = example_maps(n)
        mb = sum(a.nbytes for a in maps.values()) / 2**20
        times = {}
        for ours in (False, True):
            write(maps, ours)  # warm-up (the pool's threads, the page cache)
            times[ours] = min(write(maps, ours) for _ in range(args.repeat))
        row = {"n": n, "map_mb": mb, "hdf5_filters_s": times[False], "attattr_s": times[True],
               "ratio": times[False] / times[True], "workers": compress.workers(), "encoder": compress.ENCODER}
        rows.append(row)
        print(f"n = {n:<5} {mb:7.1f} MB of maps: hdf5 filters {times[False]:.3f} s ({mb / times[False]:.0f} MB/s), "
              f"attattr {times[True]:.3f} s ({mb / times[True]:.0f} MB/s): {row['ratio']:.2f}x", flush=True)
    runs = []
    maps = example_maps(args.ns[0])
    for score_ms in args.score_ms:
        per = {behind: run(maps, args.run_examples, score_ms / 1e3, behind) for behind in (False, True)}
        runs.append({"n": args.ns[0], "score_ms": score_ms, "examples": args.run_examples,
                     "in_line_s": per[False], "behind_s": per[True], "ratio": per[False] / per[True]})
        print(f"a run of {args.run_examples} examples at n = {args.ns[0]}, each scored in {score_ms:g} ms: written in line "
              f"{per[False]:.3f} s/example, behind {per[True]:.3f} s/example: {per[False] / per[True]:.2f}x", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "runs": runs, "cores": os.cpu_count()}, indent=1))


if __name__ == "__main__":
    main()
