"""The architecture matrix: every text model type of tests/arch_matrix.py either scores, in
float64 with the right rule and 8 steps, and agrees with the independent reference (the
model's own eager attention, its softmax intercepted) to 1e-6 relative for every layer of
every attention family, or is refused by load_model with one ModelError line.

The catalog (tests/arch_states.json, written by tests/arch_catalog.py from transformers' own
mappings) extends it to every text model type transformers maps to a classifier or a causal
LM: each verified one is checked the same way, each refused one gives its recorded line."""

from __future__ import annotations

import json
import time
from types import SimpleNamespace
from pathlib import Path

import pytest
import torch

import attattr_cli as aa
from attattr_cli import convergence
from attattr_cli.data.types import Example
from attattr_cli.engine.integrate import nodes
from attattr_cli.engine.options import ScoreOptions
from attattr_cli.engine.scorer import Scorer
from attattr_cli.errors import ModelError, OptionError
from attattr_cli.models.loading import prepare
from conftest import one_error_line, run_cli
from arch_matrix import (DECODERS, ENCODER_DECODERS, FLOAT32_REFERENCE, MODEL_TYPES, MOE, REFUSED, build, config_for,
                         reference)

TEXT = "w1 w2 w3 w4 w5 w6"
TOL = 1e-6
STATES = json.loads((Path(__file__).parent / "arch_states.json").read_text())
CATALOG_VERIFIED = sorted(t for t, v in STATES.items() if v["state"] == "verified" and t not in MODEL_TYPES)
CATALOG_REFUSED = sorted(t for t, v in STATES.items() if v["state"] == "refused" and t not in REFUSED)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def tol_for(model_type: str) -> float:
    return 1e-4 if model_type in FLOAT32_REFERENCE else TOL


def check(model_type: str, tokenizer, dtype=torch.float64, **overrides) -> dict:
    """Score ``model_type`` and compare with the reference; {site: relative difference}
    (in float32 where the model's own code cannot run in float64)."""
    dtype = torch.float32 if model_type in FLOAT32_REFERENCE else dtype
    model, lm = build(model_type, dtype, **overrides)
    loaded = prepare(model, tokenizer, f"tiny-{model_type}", lm=lm)
    scorer = Scorer(loaded, ScoreOptions(steps=8, rule="right", dtype="float64" if dtype == torch.float64
                                         else "float32", lm=lm, group=1))
    result = scorer.score(Example(0, TEXT))
    inputs = scorer.encode(Example(0, TEXT)).model_inputs()
    alphas, weights = nodes("right", 8)
    ref, target = reference(model, inputs, alphas, weights, lm=lm)
    assert target == (result.meta["lm"]["target_ids"][0] if lm else result.target)
    out = {}
    for family, fs in result.families.items():
        for k, layer in enumerate(fs.layers):
            got = torch.from_numpy(fs.attribution[k]).double()
            want = ref[(family, layer)]
            assert got.shape == want.shape, (family, layer, got.shape, want.shape)
            out[(family, layer)] = _rel(got, want)
    assert set(out) == set(ref), (sorted(out), sorted(ref))
    return out


@pytest.mark.parametrize("model_type", [t for t in MODEL_TYPES if t not in REFUSED])
def test_scores_and_agrees_with_reference(model_type, tokenizer):
    diffs = check(model_type, tokenizer)
    assert diffs and max(diffs.values()) < TOL, diffs


def test_catalog_is_transformers_own():
    """The catalog holds exactly the text types transformers maps now: after an upgrade this
    names the new ones (run python tests/arch_catalog.py)."""
    from attattr_cli.models.catalog import text_types

    now = set(text_types())
    assert set(STATES) == now, f"new: {sorted(now - set(STATES))}, gone: {sorted(set(STATES) - now)}"
    assert not [t for t, v in STATES.items() if v["state"] == "DISAGREES"]


@pytest.mark.parametrize("model_type", CATALOG_VERIFIED)
def test_catalog_types_agree_with_reference(model_type, tokenizer):
    diffs = check(model_type, tokenizer)
    assert diffs and max(diffs.values()) < tol_for(model_type), diffs


@pytest.mark.parametrize("model_type", CATALOG_REFUSED)
def test_catalog_types_refused_with_their_line(model_type, tokenizer):
    """A refused type gives its one recorded line (at load, or at its first forward for a layer
    that computes attention twice), never a raw error or a map."""
    with pytest.raises(ModelError) as info:
        check(model_type, tokenizer)
    assert str(info.value) == STATES[model_type]["detail"] and "\n" not in str(info.value)


def _routed(config) -> bool:
    """Whether the model routes tokens to experts (its F jumps where the routing changes along
    alpha): a config field (or a sub-config's, DBRX's ffn_config) naming more than one expert."""
    def experts(d: dict) -> bool:
        return any(("expert" in str(k) and isinstance(v, int) and not isinstance(v, bool) and v > 1)
                   or (isinstance(v, dict) and experts(v)) for k, v in d.items())
    return experts(config.to_dict())


COMPLETE = sorted(t for t in [*MODEL_TYPES, *CATALOG_VERIFIED] if t not in REFUSED and not _routed(config_for(t)))


def _residuals(model_type: str, tokenizer, nodes: int) -> dict:
    """{(family, layer): |sum Attr - (F(1) - F(0))| / (|F(1) - F(0)| + sum |Attr|)} with Gauss-Legendre
    at ``nodes`` nodes, on the tiny model with its random weights as initialised."""
    model, lm = build(model_type, spread=1.0)
    scorer = Scorer(prepare(model, tokenizer, model_type, lm=lm),
                    ScoreOptions(steps=nodes, rule="gauss", dtype="float64", lm=lm, group=1))
    result = scorer.score(Example(0, TEXT))
    out = {}
    for family, fs in result.families.items():
        for k, layer in enumerate(fs.layers):
            scale = abs(result.f_full - fs.f_baseline[k]) + abs(fs.attribution[k]).sum()
            out[(family, layer)] = abs(fs.residual[k]) / scale
    return out


@pytest.mark.parametrize("model_type", COMPLETE)
def test_completeness_residual_vanishes_as_the_rule_refines(model_type, tokenizer):
    """The check that catches a wrong map (differential attention's two softmaxes scored as
    one): where F is smooth along alpha (no expert routing), the completeness residual
    sum Attr - (F(1) - F(0)) of every layer goes to 0 as the quadrature refines (24 -> 48
    Gauss-Legendre nodes: at least halved, or already below 1e-3 of the layer's scale), where
    a wrong map leaves a residual that no rule removes. A type where it cannot is refused."""
    coarse, fine = _residuals(model_type, tokenizer, 24), _residuals(model_type, tokenizer, 48)
    for site, r in fine.items():
        assert r <= 1e-3 or r <= 0.5 * coarse[site], (site, coarse[site], r)


@pytest.mark.parametrize("model_type,overrides", [
    ("falcon", dict(alibi=False, new_decoder_architecture=True, num_kv_heads=2, parallel_attn=True,  # rotary, GQA
                    num_ln_in_parallel_attn=2)),
    ("falcon", dict(alibi=False, multi_query=True, new_decoder_architecture=False)),  # rotary, one K/V head
    ("deberta-v2", dict(share_att_key=False, position_buckets=-1)),  # own position projections, no buckets
    ("deberta", dict(pos_att_type=["c2p"])),
    ("albert", dict(num_hidden_layers=4, num_hidden_groups=2)),  # two groups, each shared by two layers
    ("longformer", dict(attention_window=[4, 6])),  # a window per layer
    ("t5", dict(feed_forward_proj="gated-gelu")),
])
def test_variants_agree_with_reference(model_type, overrides, tokenizer):
    diffs = check(model_type, tokenizer, **overrides)
    assert diffs and max(diffs.values()) < TOL, diffs


@pytest.mark.parametrize("model_type,overrides,said", [
    # a sliding-window layer of 64 heads (swa_num_attention_heads) below a full one of 4
    ("inkling_text", dict(layer_types=["hybrid_sliding", "hybrid"]),
     "has self layers with different numbers of attention heads (layer 0: 64, layer 1: 4)"),
    ("gemma3n_text", dict(num_hidden_layers=4, num_kv_shared_layers=2, intermediate_size=[128] * 4,
                          activation_sparsity_pattern=[0.0] * 4,
                          layer_types=["sliding_attention", "full_attention"] * 2),
     "is not supported with num_kv_shared_layers = 2"),
    ("gemma4_text", dict(num_hidden_layers=4, num_kv_shared_layers=2,
                         layer_types=["sliding_attention", "full_attention"] * 2),
     "is not supported with num_kv_shared_layers = 2"),
])
def test_configurations_attattr_cannot_attribute_are_one_line(model_type, overrides, said, tokenizer):
    """Layers of different head counts cannot share one [layer, head, query, key] array, and
    layers that reuse the keys and values of a lower one miss them when the layers below a
    target are replayed: each is one ModelError at load, never a raw error or a wrong map."""
    model, _ = build(model_type, torch.float32, **overrides)
    with pytest.raises(ModelError) as info:
        aa.load_model((model, tokenizer))
    assert said in str(info.value) and "\n" not in str(info.value), str(info.value)


def test_gemma3n_altup_streams_replay_with_their_batch(tokenizer):
    """Gemma 3n's layers hand up [streams, batch, tokens, features]: the replay below a target
    layer expands the batch axis, and every layer agrees with the reference."""
    diffs = check("gemma3n_text", tokenizer)
    assert set(diffs) == {("self", 0), ("self", 1)} and max(diffs.values()) < TOL, diffs


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_at_load_with_one_line(model_type, tokenizer):
    model, _ = build(model_type)
    with pytest.raises(ModelError) as info:
        aa.load_model((model, tokenizer))
    message = str(info.value)
    assert "\n" not in message and REFUSED[model_type] in message.lower(), message
    assert "supported" in message or "supports" in message, message


@pytest.mark.parametrize("model_type", sorted(REFUSED))
def test_refused_folder_is_one_cli_error_line(model_type, tokenizer, tmp_path):
    """A refused model folder, tried from the command line: one Error line, no traceback."""
    model, lm = build(model_type, torch.float32)
    model.save_pretrained(tmp_path / model_type)
    tokenizer.save_pretrained(tmp_path / model_type)
    args = ["score", "--model", tmp_path / model_type, "--steps", "2", "--out", tmp_path / "s.h5"]
    args += ["--lm", "--prompt", TEXT] if lm else ["--data", _tsv(tmp_path)]
    one_error_line(run_cli(*args), REFUSED[model_type])


def _tsv(tmp_path):
    path = tmp_path / "d.tsv"
    path.write_text("sentence\tlabel\n" + TEXT + "\t0\n")
    return path


@pytest.mark.parametrize("model_type", MOE)
def test_mixture_of_experts_scores_in_float32(model_type, tokenizer):
    model, lm = build(model_type, torch.float32)
    res = aa.score((model, tokenizer), [TEXT], rule="right", steps=8, dtype="float32", lm=lm)
    maps = res[0].attribution
    assert torch.isfinite(torch.as_tensor(maps)).all() and float(abs(torch.as_tensor(maps)).max()) > 0


@pytest.mark.parametrize("model_type", [t for t in MODEL_TYPES if t not in REFUSED])
def test_decoders_from_the_model(model_type, tokenizer):
    """Causal self-attention is read from the model (config, its attention modules, the
    adapter), not from a list of names; encoder-decoder models are not decoders."""
    model, lm = build(model_type, torch.float32)
    arch = prepare(model, tokenizer, model_type, lm=lm).arch
    assert arch.is_decoder == (model_type in DECODERS or model_type in MOE), model_type
    assert arch.is_encoder_decoder == (model_type in ENCODER_DECODERS), model_type


def group_difference(model_type: str, tokenizer) -> float | None:
    """How far scoring in one padded group is from scoring one at a time (float64, sentences of
    different lengths and, where the model takes a second segment, a pair): the largest
    difference of a map relative to its maximum, or of f_full and the logits; None where the
    model is not scored in groups (engine/grouped.py, ``groupable``)."""
    from attattr_cli.engine import grouped

    model, lm = build(model_type)
    scorer = Scorer(prepare(model, tokenizer, model_type, lm=lm),
                    ScoreOptions(steps=2, rule="right", dtype="float64", lm=lm))
    if not grouped.groupable(scorer):
        return None
    examples = [Example(0, "w1 w2 w3 w4 w5 w6 w7"), Example(1, "w8 w9"), Example(2, "w3 w1 w4")]
    if getattr(model.config, "type_vocab_size", 2) >= 2:
        examples.append(Example(3, "w1 w2 w3 w4 w5", "w6 w7 w8"))
    encoded = [scorer.encode(e) for e in examples]
    alone = [scorer.score(e, c) for e, c in zip(examples, encoded)]
    together = grouped.score_group(scorer, examples, encoded)
    worst = 0.0
    for a, b in zip(alone, together):
        assert a.attribution.shape == b.attribution.shape
        worst = max(worst, float(abs(a.attribution - b.attribution).max() / abs(a.attribution).max()),
                    abs(a.f_full - b.f_full), float(abs(a.logits - b.logits).max()))
    return worst


GROUPABLE = sorted(t for t, v in STATES.items() if v.get("groupable"))


@pytest.mark.parametrize("model_type", GROUPABLE)
def test_every_groupable_architecture_scores_a_group_as_one_at_a_time(model_type, tokenizer):
    """Several examples of different lengths in one padded pass give each one's own numbers,
    f_full the model's own output for it alone, for every architecture scored in groups (the
    catalog's "groupable"; ConvBERT's convolution, which would read the padding, masks it)."""
    worst = group_difference(model_type, tokenizer)
    assert worst is not None, f"{model_type} is no longer scored in groups: run python tests/arch_catalog.py"
    assert worst <= 1e-9, worst


def test_the_catalog_says_which_architectures_are_scored_in_groups(tokenizer):
    """Every verified type has its "groupable" fact; the encoders of the matrix are grouped, the
    decoders and encoder-decoders are not (each checked here; the catalog's run checks them all)."""
    verified = [t for t, v in STATES.items() if v["state"] == "verified"]
    assert all(isinstance(STATES[t].get("groupable"), bool) for t in verified)
    assert {"bert", "convbert", "deberta-v2", "xlnet"} <= set(GROUPABLE)
    for model_type in ("gpt2", "llama", "bart", "t5", "convbert"):
        assert (group_difference(model_type, tokenizer) is not None) == STATES[model_type]["groupable"], model_type


def test_models_are_left_as_they_were(tokenizer):
    """Adapters, the ALBERT proxies, BigBird's attention type and MoE experts are put back."""
    for model_type in ("deberta-v2", "albert", "big_bird", "longformer", "xlnet", "mixtral"):
        model, lm = build(model_type)
        forwards = {m: m.__dict__.get("forward") for m in model.modules()}
        keys = list(model.state_dict())
        experts = model.config._experts_implementation
        aa.score((model, tokenizer), [TEXT], rule="right", steps=2, dtype="float64", lm=lm)
        assert {m: m.__dict__.get("forward") for m in model.modules()} == forwards, model_type
        assert list(model.state_dict()) == keys and model.config._experts_implementation == experts
        if model_type == "big_bird":
            assert model.bert.attention_type == "block_sparse"


def test_long_block_sparse_input_is_one_error_line(tokenizer):
    model, _ = build("big_bird")  # block size 4, one random block: full attention up to 28 tokens
    with pytest.raises(ModelError, match="block-sparse attention .* over 28 tokens"):
        aa.score((model, tokenizer), [" ".join(f"w{i % 40}" for i in range(40))], rule="right", steps=2,
                 dtype="float64")


@pytest.mark.parametrize("model_type", ["t5", "mt5", "bart"])
@pytest.mark.parametrize("continuation", [None, "w7 w8 w9"])
def test_encoder_decoder_generation_targets(model_type, continuation, tokenizer):
    """An encoder-decoder LM (T5ForConditionalGeneration, ...): the prompt is the encoder's
    input, the target the continuation's joint probability on the decoder side (or the first
    decoder token); every family agrees with the reference."""
    import transformers as tf

    config = config_for(model_type)
    torch.manual_seed(0)
    model = tf.AutoModelForSeq2SeqLM.from_config(config).double().eval()
    loaded = prepare(model, tokenizer, model_type, lm=True)
    assert loaded.arch.family_names == ["encoder", "decoder", "cross"]
    scorer = Scorer(loaded, ScoreOptions(steps=8, rule="right", dtype="float64", lm=True, continuation=continuation))
    result = scorer.score(Example(0, TEXT))
    enc = scorer.encode(Example(0, TEXT))
    lm = result.meta["lm"]
    targets = torch.tensor(lm["target_ids"])
    n_dec = len(enc.decoder_input_ids)
    assert n_dec == (1 if continuation is None else 3) and lm["positions"] == list(range(len(targets)))
    if continuation is not None:
        assert lm["target_tokens"] == continuation.split() and result.decoder_tokens[1:] == ["w7", "w8"]

    def f_of_logits(logits):  # the joint probability of the targets at the decoder positions
        logp = torch.log_softmax(logits[:, :len(targets)], -1)
        return logp.gather(-1, targets.view(1, -1, 1).expand(logits.shape[0], -1, 1)).squeeze(-1).sum(-1).exp()

    inputs = dict(enc.model_inputs(), decoder_input_ids=enc.decoder_input_ids)
    alphas, weights = nodes("right", 8)
    ref, _ = reference(model, inputs, alphas, weights, f_of_logits=f_of_logits)
    n = len(enc.input_ids)
    shapes = {"encoder": (n, n), "decoder": (n_dec, n_dec), "cross": (n_dec, n)}
    for family, fs in result.families.items():
        for k, layer in enumerate(fs.layers):
            got = torch.from_numpy(fs.attribution[k]).double()
            assert got.shape[1:] == shapes[family]
            assert _rel(got, ref[(family, layer)]) < TOL, (family, layer)


@pytest.mark.parametrize("model_type", ["t5", "deberta-v2", "bloom", "longformer", "xlnet"])
def test_saved_projections_have_one_shape(model_type, tokenizer):
    """A position bias folded into the projections widens q and k; v is padded to match, as
    the CUDA kernels require of their inputs (a checking backend stands in for them here)."""
    from attattr_cli.ops import TorchBackend

    seen = []

    class Checking(TorchBackend):
        def attention_forward(self, q, k, v, mask=None, scale=None, causal=False):
            assert q.shape == k.shape == v.shape, (q.shape, k.shape, v.shape)
            seen.append(q.shape)
            return super().attention_forward(q, k, v, mask, scale, causal)

        def attribution_from_grad(self, q, k, v, g, *args, **kwargs):
            assert q.shape == k.shape == v.shape and g.shape[-1] == v.shape[-1], (q.shape, v.shape, g.shape)
            return super().attribution_from_grad(q, k, v, g, *args, **kwargs)

    model, lm = build(model_type)
    scorer = Scorer(prepare(model, tokenizer, model_type, lm=lm), ScoreOptions(steps=4, dtype="float64", lm=lm))
    reference_maps = scorer.score(Example(0, TEXT))
    scorer.backend = Checking()
    checked = scorer.score(Example(0, TEXT))
    assert seen
    for family, fs in checked.families.items():
        assert abs(fs.attribution - reference_maps.families[family].attribution).max() < 1e-12


def test_hybrid_lists_its_other_layers_and_says_so_once(tokenizer, tmp_path):
    """A hybrid (Jamba: a Mamba layer, then an attention layer) scores its attention layer only,
    says so once on stderr, and lists the Mamba layer as not attention in the store and info."""
    model, lm = build("jamba", torch.float32)
    model.save_pretrained(tmp_path / "jamba")
    tokenizer.save_pretrained(tmp_path / "jamba")
    loaded = prepare(model, tokenizer, "jamba", lm=lm)
    assert loaded.arch.families[0].not_attention == ((0, "Mamba"),) and loaded.arch.families[0].attention_layers == [1]
    store = tmp_path / "s.h5"
    result = run_cli("score", "--model", tmp_path / "jamba", "--data", _tsv(tmp_path), "--steps", "2",
                     "--out", store)
    assert result.exit_code == 0, result.output
    assert result.stderr.count("is a hybrid") == 1 and "Mamba: layers 0" in result.stderr, result.stderr
    info = aa.info(store)
    assert info["families"]["self"]["layers"] == [1]
    assert info["provenance"]["families"]["self"]["not_attention"] == {"0": "Mamba"}
    shown = run_cli("info", store)
    assert "not attention (self)" in shown.stdout and "0 Mamba" in shown.stdout, shown.stdout
    with pytest.raises(OptionError, match="compute no softmax attention; the attention layers are 1"):
        aa.score((model, tokenizer), [TEXT], layers=[0], steps=2, dtype="float32", lm=lm)


def test_attention_sink_stays_in_the_denominator(tokenizer):
    """gpt-oss: the stored probabilities of the real keys are the model's (rows sum to less than
    1, the sink logit in the denominator) and the attribution's shape is token by token."""
    model, lm = build("gpt_oss")
    res = aa.score((model, tokenizer), [TEXT], rule="right", steps=4, dtype="float64", lm=lm)[0]
    probs = torch.as_tensor(res.attention)
    n = len(res.tokens)
    assert probs.shape[-2:] == (n, n) and res.attribution.shape[-2:] == (n, n)
    rows = probs.sum(-1)
    assert (rows < 1 - 1e-6).all() and (rows > 0).all()
    model.config._attn_implementation = "eager"  # the model's own: softmax over [scores, sink], sink column dropped
    model.set_experts_implementation("eager")  # grouped experts take no float64
    with torch.no_grad():
        own = model(torch.tensor([list(res.input_ids)]), output_attentions=True, use_cache=False).attentions
    assert torch.allclose(probs.double(), torch.stack([a[0] for a in own]).double(), rtol=0, atol=1e-6)


def test_memory_estimate_takes_per_layer_widths(tokenizer):
    """Gemma 3n's config gives intermediate_size per layer: the estimate uses the widest."""
    from attattr_cli.engine.memory import step_bytes

    model, lm = build("llama", torch.float32)
    arch = prepare(model, tokenizer, "llama", lm=lm).arch
    one = step_bytes(model.config, arch, ("self", 0), 16, torch.float32, torch.device("cpu"))
    per_layer = SimpleNamespace(**{k: getattr(model.config, k) for k in ("hidden_size", "vocab_size")},
                                intermediate_size=[64, 128])  # the fields the estimate reads, as Gemma 3n gives them
    assert step_bytes(per_layer, arch, ("self", 0), 16, torch.float32, torch.device("cpu")) == one


def test_mixture_of_experts_float64_path_is_flagged(tokenizer):
    """Float64 runs the eager experts; with the error-controlled rule, a layer whose routing
    switches along alpha is flagged as a non-smooth path rather than called converged."""
    model, lm = build("mixtral", torch.float64)
    res = aa.score((model, tokenizer), ["w1 w2 w3 w4 w5 w6 w7 w8 w9 w10 w11 w12"], dtype="float64", lm=lm)
    assert res[0].unconverged_layers and set(res[0].unconverged_layers.values()) == {"non-smooth path"}
    assert model.config._experts_implementation == "grouped_mm"  # put back


if __name__ == "__main__":  # the matrix as a table: python tests/test_architectures.py [types...]
    import sys
    import traceback

    from transformers import BertTokenizerFast
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                            *[f"w{i}" for i in range(40)]]) + "\n")
    tok = BertTokenizerFast(str(d / "vocab.txt"), model_max_length=48)
    ok = 0
    for mt in sys.argv[1:] or MODEL_TYPES:
        t0 = time.time()
        try:
            diffs = check(mt, tok)
            worst = max(diffs.values())
            ok += worst < TOL
            print(f"{mt:14s} {'OK ' if worst < TOL else 'BAD'} max rel {worst:.1e} ({time.time() - t0:.1f}s)", flush=True)
        except ModelError as exc:
            print(f"{mt:14s} REFUSED {exc} ({time.time() - t0:.1f}s)", flush=True)
        except Exception as exc:  # noqa: BLE001
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            print(f"{mt:14s} FAIL {type(exc).__name__}: {str(exc).splitlines()[0][:150]} @ {tb.filename.split('/')[-1]}:{tb.lineno}", flush=True)
    print(f"{ok} of {len(sys.argv[1:] or MODEL_TYPES)} agree")
