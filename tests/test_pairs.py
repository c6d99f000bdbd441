"""Counterfactual pairs as data (data/pairs.py): the generators for any tokenizer, `attattr demo
data --task`, pairs scored each with its own answer and foil into one store (merge, resume,
save), and head importance and pruning of such a store."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from attattr_cli.data import pairs as P
from attattr_cli.errors import DataError
from conftest import one_error_line, run_cli
from tiny_bpe import MISSING, save_bpe_tokenizer

SMOLLM2 = "/work/models/smollm2"


@pytest.fixture(scope="session")
def bpe_dir(tmp_path_factory):
    """A byte-level BPE tokenizer with one token per digit (as SmolLM2's)."""
    return save_bpe_tokenizer(tmp_path_factory.mktemp("bpe_digits"))


@pytest.fixture(scope="session")
def bpe(bpe_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(bpe_dir)


@pytest.fixture(scope="session")
def bpe_two(tmp_path_factory):
    """The same with a token for every two-digit number (as GPT-2's years)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(save_bpe_tokenizer(tmp_path_factory.mktemp("bpe_two"), two_digit_years=True))


@pytest.fixture(scope="session")
def lm_dir(tmp_path_factory, bpe_dir, bpe):
    """A tiny random Llama causal LM saved with the BPE tokenizer: loadable by path."""
    import transformers as tf

    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=len(bpe), hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=37, max_position_embeddings=64,
                         bos_token_id=2, eos_token_id=3, pad_token_id=0)
    model = tf.LlamaForCausalLM(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3.0)  # a random model's logits spread out: the metrics are not all near zero
    d = tmp_path_factory.mktemp("tiny_llama_bpe")
    model.eval().save_pretrained(d)
    bpe.save_pretrained(d)
    return d


@pytest.fixture(scope="session")
def ioi_file(tmp_path_factory, lm_dir):
    out = tmp_path_factory.mktemp("pairs") / "ioi.jsonl"
    r = run_cli("demo", "data", "--task", "ioi", "--model", lm_dir, "--count", 6, "--seed", 3, "--out", out)
    assert r.exit_code == 0, r.output
    return out
