#!/usr/bin/env bash
# Every GPU check in one command, for a GPU machine that cannot install anything (no `just setup`):
# the kernel build, `just gpu-test`, `just gpu-bench` and `just bench-long-gpu`, each under its own
# time limit inside one overall deadline, so one that hangs or runs long leaves the rest their turn.
#
#   bench/gpu_all.sh [LOGDIR]      PY (default python3) must already hold torch (CUDA) and the
#                                  project's dependencies; DEADLINE: seconds for everything (560)
#
# Writes LOGDIR/<step>.log for each step, LOGDIR/summary.txt (machine, versions, each step's exit
# status and seconds) and LOGDIR/bench-long-gpu.json.
set -u
PY=${PY:-python3}
LOG=${1:-gpu-logs}
DEADLINE=${DEADLINE:-560}
mkdir -p "$LOG"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
start=$(date +%s)

step() {  # step NAME CAP_SECONDS COMMAND...
  local name=$1 cap=$2 left t s rc
  shift 2
  left=$((DEADLINE - ($(date +%s) - start)))
  t=$((cap < left ? cap : left))
  if [ "$t" -le 10 ]; then
    echo "== $name: not run, the deadline was reached" | tee -a "$LOG/summary.txt"
    return
  fi
  echo "== $name (at most ${t} s): $*"
  s=$(date +%s)
  timeout -k 5 "$t" "$@" > >(tee "$LOG/$name.log") 2>&1
  rc=$?
  echo "== $name: exit $rc after $(($(date +%s) - s)) s" | tee -a "$LOG/summary.txt"
}

{
  nvidia-smi -L 2>&1
  nvcc --version 2>&1 | tail -n 2
  "$PY" -c "import sys, torch, transformers; print('python', sys.version.split()[0], '| torch', torch.__version__, 'cuda', torch.version.cuda, '| transformers', transformers.__version__)" 2>&1
} | tee -a "$LOG/summary.txt"

step build 240 "$PY" -c "from attattr_cli.ops import kernel; print(kernel.build())"
step gpu-test 150 "$PY" -m pytest -q -m gpu tests/test_kernels.py -rs --durations=8 -p no:cacheprovider
step bench-kernel 90 "$PY" bench/bench_kernel.py
step bench-gpu-score 120 "$PY" bench/bench_gpu_score.py
step bench-long-gpu 240 "$PY" bench/bench_long_decoder.py --gpu --json "$LOG/bench-long-gpu.json"
echo "== total $(($(date +%s) - start)) s" | tee -a "$LOG/summary.txt"
