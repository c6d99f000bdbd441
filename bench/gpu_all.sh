#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine that cannot install anything (no `just setup`):
# the kernel build, the kernel benchmark (one table: kernel vs reference vs SDPA flash backward,
# n = 128 .. 16,384, time and TFLOP/s, launches per scored example, one integration-like pass
# eager and as a CUDA-graph replay), long-context sources (`--keep sources`, Qwen2-0.5B's config,
# random weights) at 8,192 and 32,768 tokens, `just gpu-test`, the store's map writes on the machine's
# cores (bench_store_write.py), bench_gpu_score.py and
# `just bench-long-gpu`, each under its own time limit inside one overall deadline (8 minutes by
# default), so one that hangs or runs long leaves the rest their turn.
#
#   bench/gpu_all.sh [LOGDIR]      PY (default python3) must already hold torch (CUDA) and the
#                                  project's dependencies; DEADLINE: seconds for everything (480)
#   DRY_RUN=1 bench/gpu_all.sh     no GPU needed: prints the steps and their limits, runs the
#                                  CPU versions (the benchmark's smoke table, the op counts of a
#                                  scored example at 128 tokens, the sources script on a tiny
#                                  model), and writes the same files
#
# Writes LOGDIR/<step>.log for each step, LOGDIR/summary.txt (machine, versions, each step's exit
# status and seconds), LOGDIR/bench-kernel.json, LOGDIR/sources-8k.json, LOGDIR/sources-32k.json,
# LOGDIR/bench-long-gpu.json and LOGDIR/gpu-all.json (the steps and every figure of those JSONs),
# and prints the benchmark's table last.
set -u
PY=${PY:-python3}
LOG=${1:-gpu-logs}
DEADLINE=${DEADLINE:-480}
DRY_RUN=${DRY_RUN:-0}
mkdir -p "$LOG"
: > "$LOG/summary.txt"
: > "$LOG/steps.tsv"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)

step() {  # step NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2 left t s rc
  shift 2
  left=$((DEADLINE - ($(date +%s) - start)))
  t=$((cap < left ? cap : left))
  if [ "$t" -le 10 ]; then
    echo "== $name: not run, the deadline was reached" | tee -a "$LOG/summary.txt"
    printf '%s\t%s\t%s\t%s\n' "$name" "not run" 0 "$t" >> "$LOG/steps.tsv"
    return
  fi
  echo "== $name (at most ${t} s): $*"
  if [ "$DRY_RUN" = 1 ]; then
    echo "== $name: dry run, not run" | tee -a "$LOG/summary.txt"
    printf '%s\t%s\t%s\t%s\n' "$name" "dry run" 0 "$t" >> "$LOG/steps.tsv"
    return
  fi
  s=$(date +%s)
  timeout -k 5 "$t" "$@" > >(tee "$LOG/$name.log") 2>&1
  rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - s)) s" | tee -a "$LOG/summary.txt"
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(($(date +%s) - s))" "$t" >> "$LOG/steps.tsv"
}

{
  nvidia-smi -L 2>&1
  nvcc --version 2>&1 | tail -n 2
  "$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)" 2>&1
} | tee -a "$LOG/summary.txt"

# The benchmark runs right after the build: it is what the deadline must not cut.
step build 200 "$PY" -c "from attattr_cli.ops import kernel; print(kernel.build())"
step bench-kernel 150 "$PY" bench/bench_kernel.py --budget 90 --launches 128 512 --graph-pass 128 512 --host-time \
  --json "$LOG/bench-kernel.json"
step sources-8k 110 "$PY" bench/bench_long_sources.py --n 8192 --timeout 100 --json "$LOG/sources-8k.json"
step gpu-test 120 "$PY" -m pytest -q -m gpu tests/test_kernels.py -rs --durations=8 -p no:cacheprovider
step bench-store 45 "$PY" bench/bench_store_write.py --ns 128 512 --repeat 1 --json "$LOG/bench-store.json"
step sources-32k 150 "$PY" bench/bench_long_sources.py --n 32768 --timeout 140 --json "$LOG/sources-32k.json"
step bench-gpu-score 90 "$PY" bench/bench_gpu_score.py
step bench-long-gpu 120 "$PY" bench/bench_long_decoder.py --gpu --json "$LOG/bench-long-gpu.json"
if [ "$DRY_RUN" = 1 ]; then
  echo "== bench-kernel smoke (CPU, dry run): $PY bench/bench_kernel.py --smoke --count-ops 128"
  "$PY" bench/bench_kernel.py --smoke --count-ops 128 --json "$LOG/bench-kernel.json" > "$LOG/bench-kernel.log" 2>&1
  echo "== bench-kernel smoke: exit $?" | tee -a "$LOG/summary.txt"
  echo "== sources smoke (CPU, dry run): $PY bench/bench_long_sources.py --smoke"
  "$PY" bench/bench_long_sources.py --smoke --json "$LOG/sources-8k.json" > "$LOG/sources-8k.log" 2>&1
  echo "== sources smoke: exit $?" | tee -a "$LOG/summary.txt"
fi
echo "== total $(($(date +%s) - start)) s" | tee -a "$LOG/summary.txt"

# One JSON of the run, and the benchmark's table last.
"$PY" - "$LOG" <<'EOF'
import json, sys
from pathlib import Path

log = Path(sys.argv[1])
steps = []
for line in (log / "steps.tsv").read_text().splitlines():
    name, status, seconds, limit = line.split("\t")
    steps.append({"step": name, "exit": status, "seconds": int(seconds), "limit_s": int(limit)})
def load(name):
    path = log / name
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except ValueError as error:  # a step cut by its limit while writing
        return {"unreadable": str(error)}

payload = {"summary": (log / "summary.txt").read_text(), "steps": steps,
           "bench_kernel": load("bench-kernel.json"), "sources_8k": load("sources-8k.json"),
           "sources_32k": load("sources-32k.json"), "bench_long_gpu": load("bench-long-gpu.json"),
           "bench_store": load("bench-store.json")}
(log / "gpu-all.json").write_text(json.dumps(payload, indent=1))
print()
print(payload["bench_kernel"].get("table", "(no table)") if payload["bench_kernel"] else "(no bench-kernel figures)")
for key in ("sources_8k", "sources_32k"):
    for row in (payload[key] or {}).get("rows", []):
        print(f"{key}: n = {row.get('n')}: {row.get('status')}, {row.get('seconds')} s, peak {row.get('peak_gib')} GiB, "
              f"op alone {row.get('op')}")
for row in (payload["bench_store"] or {}).get("rows", []):
    print(f"store write: n = {row.get('n')}: hdf5 filters {row.get('hdf5_filters_s')} s, attattr {row.get('attattr_s')} s"
          f" ({row.get('workers')} threads)")
print(f"\n# wrote {log / 'gpu-all.json'}")
EOF
