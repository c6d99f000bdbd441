"""GGUF files (llama.cpp's format): ``--model FILE.gguf`` (or a folder holding one) loads the
model dequantized, and ``attattr convert`` writes it as a plain model folder that loads to the
same weights and scores the same (attattr_cli/models/gguf.py). The file is a tiny Llama written
here with the ``gguf`` package (float32 tensors, a byte-level BPE vocabulary of 64 tokens)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import one_error_line, run_cli

gguf = pytest.importorskip("gguf", reason="the gguf package writes the test's GGUF file")

PROMPT = "ab cd ef"


def write_tiny_gguf(path) -> None:
    """A 2-layer Llama (hidden 64, 4 heads, 2 key-value heads, tied embeddings) as GGUF."""
    import transformers as tf

    chars = [*"abcdefghijklmnopqrstuvwxyz", "Ġ"]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *chars]
    merges = []
    for a in "abcdefgh":
        tokens.append("Ġ" + a)
        merges.append("Ġ " + a)
    for a, b in (("a", "b"), ("c", "d"), ("e", "f"), ("g", "h")):
        tokens.append(a + b)
        merges.append(f"{a} {b}")
    tokens += [f"<extra_{i}>" for i in range(64 - len(tokens))]
    cfg = tf.LlamaConfig(vocab_size=64, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    state = {k: v.detach().float().numpy() * 1.5 for k, v in tf.LlamaForCausalLM(cfg).state_dict().items()}
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_block_count(2)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(16)
    w.add_vocab_size(64)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_merges(merges)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    names = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    parts = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
             "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
    for i in range(2):
        names.update({f"model.layers.{i}.{k}.weight": f"blk.{i}.{v}.weight" for k, v in parts.items()})
    for key, name in names.items():
        w.add_tensor(name, state[key])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny.Q.gguf"
    write_tiny_gguf(path)
    return path


@pytest.fixture(scope="module")
def converted(tiny_gguf, tmp_path_factory):
    out = tmp_path_factory.mktemp("converted") / "tiny"
    r = run_cli("convert", tiny_gguf, "--out", out)
    assert r.exit_code == 0, r.output
    assert r.stdout.strip() == str(out) and "converted" in r.stderr and "llama" in r.stderr
    return out


def test_convert_writes_a_plain_folder_that_loads_to_the_same_model(tiny_gguf, converted):
    import attattr_cli as aa

    files = sorted(p.name for p in converted.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(files), files
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and config["architectures"] == ["LlamaForCausalLM"]
    from safetensors import safe_open

    with safe_open(str(converted / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys  # tied: written once
    direct, folder = aa.load_model(str(tiny_gguf), lm=True), aa.load_model(str(converted), lm=True)
    assert direct.loaded.weights_sha256 == folder.loaded.weights_sha256
    assert folder.model.lm_head.weight.data_ptr() == folder.model.model.embed_tokens.weight.data_ptr()
    a, b = aa.score(direct, [PROMPT], steps=4)[0], aa.score(folder, [PROMPT], steps=4)[0]
    assert a.tokens == b.tokens == ["ab", "Ġc", "d", "Ġe", "f"]
    assert a.f_full == b.f_full  # the same weights: the same numbers, up to float rounding
    assert np.abs(a.attribution - b.attribution).max() <= 1e-5 * np.abs(a.attribution).max()


def test_score_takes_a_gguf_file_or_its_folder(tiny_gguf, tmp_path):
    for model in (tiny_gguf, tiny_gguf.parent):
        out = tmp_path / f"{model.name}.h5"
        r = run_cli("score", "--lm", "--model", model, "--prompt", PROMPT, "--steps", 2, "-q", "--out", out)
        assert r.exit_code == 0, r.output
        from attattr_cli.store import Store

        with Store(out) as s:
            assert s.get(0).tokens == ["ab", "Ġc", "d", "Ġe", "f"]
            assert s.provenance["model_path"].endswith(model.name)  # what was given: loads again


def test_gguf_mistakes_are_one_line_and_nothing_is_replaced(tiny_gguf, converted, tmp_path):
    out = tmp_path / "s.h5"
    data = tmp_path / "d.tsv"
    data.write_text("sentence\tlabel\nab cd\t1\n")
    one_error_line(run_cli("score", "--model", tiny_gguf, "--data", data, "--out", out),
                   "is a GGUF file, which holds a language model: pass --lm")
    two = tmp_path / "two"
    two.mkdir()
    for name in ("a.gguf", "b.gguf"):
        (two / name).write_bytes(tiny_gguf.read_bytes())
    one_error_line(run_cli("score", "--lm", "--model", two, "--prompt", PROMPT, "--out", out),
                   "holds 2 GGUF files (a.gguf, b.gguf): give the one to load")
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(tiny_gguf.read_bytes()[:300])
    one_error_line(run_cli("score", "--lm", "--model", broken, "--prompt", PROMPT, "--out", out),
                   "cannot load the GGUF file")
    assert not out.exists()
    before = {p.name: p.read_bytes() for p in converted.iterdir()}
    one_error_line(run_cli("convert", tiny_gguf, "--out", converted), "exists and is not empty", "nothing there is replaced")
    assert {p.name: p.read_bytes() for p in converted.iterdir()} == before
    empty = tmp_path / "empty"
    empty.mkdir()
    one_error_line(run_cli("convert", empty, "--out", tmp_path / "new"), "is not a GGUF file")
    one_error_line(run_cli("convert", broken, "--out", tmp_path / "new"), "cannot load the GGUF file")
    assert not (tmp_path / "new").exists()
