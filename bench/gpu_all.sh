#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine that cannot install anything (no `just setup`):
# the kernel build, the kernel benchmark (one table: kernel vs reference vs SDPA flash backward,
# n = 128 .. 16,384, time and TFLOP/s, launches per scored example), `just gpu-test`,
# bench_gpu_score.py and `just bench-long-gpu`, each under its own time limit inside one overall
# deadline (8 minutes by default), so one that hangs or runs long leaves the rest their turn.
#
#   bench/gpu_all.sh [LOGDIR]      PY (default python3) must already hold torch (CUDA) and the
#                                  project's dependencies; DEADLINE: seconds for everything (480)
#   DRY_RUN=1 bench/gpu_all.sh     no GPU needed: prints the steps and their limits, runs the
#                                  benchmark's CPU smoke version, and writes the same files
#
# Writes LOGDIR/<step>.log for each step, LOGDIR/summary.txt (machine, versions, each step's exit
# status and seconds), LOGDIR/bench-kernel.json, LOGDIR/bench-long-gpu.json and LOGDIR/gpu-all.json
# (the steps and the benchmark's figures), and prints the benchmark's table last.
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
step bench-kernel 150 "$PY" bench/bench_kernel.py --budget 100 --launches 128 512 --json "$LOG/bench-kernel.json"
step gpu-test 150 "$PY" -m pytest -q -m gpu tests/test_kernels.py -rs --durations=8 -p no:cacheprovider
step bench-gpu-score 90 "$PY" bench/bench_gpu_score.py
step bench-long-gpu 240 "$PY" bench/bench_long_decoder.py --gpu --json "$LOG/bench-long-gpu.json"
if [ "$DRY_RUN" = 1 ]; then
  echo "== bench-kernel smoke (CPU, dry run): $PY bench/bench_kernel.py --smoke"
  "$PY" bench/bench_kernel.py --smoke --json "$LOG/bench-kernel.json" > "$LOG/bench-kernel.log" 2>&1
  echo "== bench-kernel smoke: exit $?" | tee -a "$LOG/summary.txt"
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
bench = log / "bench-kernel.json"
payload = {"summary": (log / "summary.txt").read_text(), "steps": steps,
           "bench_kernel": json.loads(bench.read_text()) if bench.exists() else None}
(log / "gpu-all.json").write_text(json.dumps(payload, indent=1))
print()
print(payload["bench_kernel"]["table"] if payload["bench_kernel"] else "(no bench-kernel figures)")
print(f"\n# wrote {log / 'gpu-all.json'}")
EOF
