"""The architecture matrix: tiny, randomly initialised models of the text model types
transformers ships (hidden 64, 2 layers, 4 heads), and an independent reference for their
attribution.

The reference knows nothing of attattr's takeover: the model runs with its own eager
attention, and the softmax that makes each target layer's attention probabilities is
intercepted (``torch.softmax``, ``torch.nn.functional.softmax``, ``Tensor.softmax``). A
clean forward records A; then for the target layer the softmax returns
``alpha_k * A`` as a leaf, one batch row per step, and
``Attr = A * sum_k w_k dF/dP_k`` (Hao et al. 2021, the definition itself). Softmaxes run in
float64 for a float64 model (some eager paths ask for float32).
"""

from __future__ import annotations

import contextlib
import inspect

import torch
import transformers as tf

VOCAB = 45  # the tests' BERT tokenizer: 5 special tokens and w0..w39

# model type -> (config keyword arguments beyond the shared ones, model class name or None for
# AutoModelForSequenceClassification). Shared: hidden 64, 2 layers, 4 heads, 128 wide MLP.
ENCODERS = ["bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert", "albert", "deberta",
            "deberta-v2", "mpnet", "funnel", "longformer", "big_bird", "xlnet", "ernie", "modernbert",
            "data2vec-text"]
DECODERS = ["gpt2", "gpt_neox", "gptj", "opt", "phi", "phi3", "llama", "mistral", "qwen2", "qwen3", "gemma",
            "gemma2", "gemma3_text", "bloom", "falcon", "starcoder2", "olmo", "olmo2", "glm", "biogpt", "smollm3", "mamba"]
ENCODER_DECODERS = ["bart", "mbart", "plbart", "t5", "mt5"]
MOE = ["mixtral", "qwen2_moe", "qwen3_moe"]
MODEL_TYPES = ENCODERS + DECODERS + ENCODER_DECODERS + MOE

# model types whose own eager code cannot run in float64 (XGLM clamps its scores with a float32
# constant): checked in float32, to 1e-4
FLOAT32_REFERENCE = frozenset({"xglm"})

# per-type fixes on top of the generic tiny config (types beyond MODEL_TYPES)
_GEMMA_STACK = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, intermediate_size=128, max_position_embeddings=64, sliding_window=4,
                    layer_types=["sliding_attention", "full_attention"])
_LIN_FULL = dict(layer_types=["linear_attention", "full_attention"])  # a hybrid: layer 0 not attention
EXTRA: dict[str, dict] = {
    **dict.fromkeys(("qwen3_next", "qwen3_5_text", "qwen3_5_moe_text", "olmo_hybrid", "minimax"), _LIN_FULL),
    "qwen4_exp_text": dict(layer_types=["linear_attention", "indexed_attention"]),
    "kimi_linear": dict(_LIN_FULL, mlp_layer_types=["dense", "sparse"], num_experts_per_token=2, linear_num_heads=4,
                        linear_head_dim=16),
    "bailing_hybrid": dict(_LIN_FULL, mlp_layer_types=["dense", "sparse"], linear_num_heads=4, linear_head_dim=16,
                           layer_group_size=2),
    "granitemoehybrid": dict(_LIN_FULL, mamba_n_heads=8, mamba_d_head=16),
    "jamba": dict(attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1),
    "bamba": dict(attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16),
    "nemotron_h": dict(layers_block_type=["linear_attention", "full_attention"], mamba_num_heads=8, mamba_head_dim=16),
    "falcon_h1": dict(mamba_n_heads=8, mamba_d_head=16, mamba_d_ssm=128),  # Mamba beside attention in each layer
    "zaya": dict(num_experts_per_tok=1),
    # no layer reusing another's keys and values (refused: tests/test_architectures.py); the generic
    # two layers would share them from layer 1 on
    "gemma3n_text": dict(num_kv_shared_layers=0),
    "mamba2": dict(num_heads=8, head_dim=16),
    "gpt_neo": dict(attention_types=[[["global", "local"], 1]], window_size=4),
    "esmc": dict(num_key_value_heads=4),
    "zamba": dict(num_hidden_layers=3, attn_layer_period=2, attn_layer_offset=0,
                  layers_block_type=["hybrid", "linear_attention", "hybrid"]),  # one attention block shared by two layers
    "bigbird_pegasus": dict(attention_type="block_sparse", block_size=4, num_random_blocks=1, decoder_start_token_id=3,
                            forced_eos_token_id=None),  # full attention up to 28 tokens
    "zamba2": dict(layers_block_type=["linear_attention", "hybrid"], hybrid_layer_ids=[1]),
    "recurrent_gemma": dict(block_types=["recurrent", "attention"]),
    "lfm2": dict(layer_types=["conv", "full_attention"], full_attn_idxs=[1]),
    "lfm2_moe": dict(layer_types=["conv", "full_attention"], num_dense_layers=1),
    "lfm3": dict(layer_types=["conv", "full_attention"]),
    "umt5": dict(relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0),
    "mvp": dict(decoder_start_token_id=3, forced_eos_token_id=None),
    "luke": dict(entity_vocab_size=10, entity_emb_size=16),
    "t5gemma": dict(encoder=_GEMMA_STACK, decoder=_GEMMA_STACK, decoder_start_token_id=0),
    "cohere_compass_text": dict(layer_types=["sliding_attention", "full_attention"], sliding_window=4,
                                rope_parameters={t: {"rope_type": "default", "rope_theta": 10000.0}
                                                 for t in ("sliding_attention", "full_attention")}),
    "xmod": dict(languages=["en_XX"], default_language="en_XX"),
    "reformer": dict(is_decoder=True, attn_layers=["local", "lsh"], axial_pos_shape=[8, 8], axial_pos_embds_dim=[32, 32]),
    "perceiver": dict(d_latents=64, num_latents=8, d_model=64, num_blocks=1, num_self_attends_per_block=1,
                      num_self_attention_heads=4, num_cross_attention_heads=4),
    "dbrx": dict(attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),
                 ffn_config=dict(ffn_hidden_size=128, moe_num_experts=4, moe_top_k=2)),
}

# model types attattr refuses at load_model, and a piece of the one line it gives
REFUSED = {
    "mamba": "no attention",
    "funnel": "funnel",
}


# any other model type: each of these config fields that its default config has, set small
# (a field's many names across architectures; per-type fixes in EXTRA)
_TINY = {
    **dict.fromkeys(("hidden_size", "d_model", "n_embd", "dim", "embed_dim", "n_embed", "word_embed_proj_dim",
                     "embedding_size", "hidden_dim_model"), 64),
    **dict.fromkeys(("num_hidden_layers", "n_layer", "n_layers", "num_layers", "encoder_layers", "decoder_layers",
                     "num_decoder_layers"), 2),
    **dict.fromkeys(("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
                     "decoder_attention_heads", "attention_heads"), 4),
    **dict.fromkeys(("num_key_value_heads", "n_kv_heads", "num_kv_heads", "multi_query_group_num"), 2),
    **dict.fromkeys(("head_dim", "d_kv", "d_head", "kv_channels", "attention_head_dim"), 16),
    **dict.fromkeys(("intermediate_size", "ffn_dim", "d_ff", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner",
                     "ffn_hidden_size", "d_inner", "inner_hidden_size", "hidden_dim", "ffn_hidden_dim"), 128),
    **dict.fromkeys(("moe_intermediate_size", "expert_intermediate_size", "shared_expert_intermediate_size",
                     "moe_ffn_hidden_size"), 32),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    **dict.fromkeys(("num_experts_per_tok", "num_experts_per_token", "moe_topk", "top_k", "moe_k"), 2),
    **dict.fromkeys(("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length"), 64),
    **dict.fromkeys(("kv_lora_rank", "q_lora_rank"), 16),
    **dict.fromkeys(("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"), 8),
    **dict.fromkeys(("state_size", "mamba_d_state", "ssm_state_size"), 8),
    "emb_dim": 64, "expert_ffn_hidden_size": 32, "zero_expert_num": 2, "vocab_size_per_layer_input": VOCAB,
    "hidden_size_per_layer_input": 16, "rotary_dim": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1, "num_expert_group": 1, "vocab_size": VOCAB,
}


def _tiny(model_type: str) -> dict:
    """The keyword arguments that make ``model_type``'s default config tiny (fields it has)."""
    defaults = tf.AutoConfig.for_model(model_type).to_dict()
    kw = {k: v for k, v in _TINY.items() if k in defaults}
    if "qk_rope_head_dim" in defaults:  # multi-head latent attention: the head is nope + rope wide
        kw.pop("head_dim", None)
        if "num_key_value_heads" in kw:  # keys per query head (the latent is shared instead)
            kw["num_key_value_heads"] = kw.get("num_attention_heads", 4)
    return kw


def config_for(model_type: str, **overrides):
    """A tiny config of ``model_type``: hidden 64, 2 layers, 4 heads, two labels (``overrides``
    on top)."""
    if model_type not in MODEL_TYPES:
        kw = dict(_tiny(model_type), num_labels=2, pad_token_id=0, bos_token_id=2, eos_token_id=3)
        kw.update(EXTRA.get(model_type, {}))
        kw.update(overrides)
        return tf.AutoConfig.for_model(model_type, **kw)
    kw = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
              intermediate_size=128, max_position_embeddings=64, num_labels=2, pad_token_id=0,
              bos_token_id=2, eos_token_id=3)
    extra = {
        "distilbert": dict(dim=64, n_layers=2, n_heads=4, hidden_dim=128),
        "albert": dict(embedding_size=32, num_hidden_groups=1, inner_group_num=1),
        "deberta": dict(relative_attention=True, pos_att_type=["c2p", "p2c"], max_relative_positions=16),
        "deberta-v2": dict(relative_attention=True, pos_att_type=["c2p", "p2c"], position_buckets=8,
                           max_relative_positions=16, norm_rel_ebd="layer_norm", share_att_key=True,
                           position_biased_input=False),
        "funnel": dict(block_sizes=[1, 1], d_model=64, n_head=4, d_head=16, d_inner=128),
        "longformer": dict(attention_window=6),  # 8 tokens: padded to 12, a band of 3 either side
        "big_bird": dict(attention_type="block_sparse", block_size=4, num_random_blocks=1),  # full up to 28 tokens
        "xlnet": dict(d_model=64, n_layer=2, n_head=4, d_inner=128),
        "modernbert": dict(global_attn_every_n_layers=2, local_attention=4),
        "gpt2": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64),
        "gptj": dict(n_embd=64, n_layer=2, n_head=4, n_positions=64, rotary_dim=8),
        "opt": dict(ffn_dim=128, word_embed_proj_dim=64),
        "llama": dict(num_key_value_heads=2),
        "mistral": dict(num_key_value_heads=2, sliding_window=4),
        "qwen2": dict(num_key_value_heads=2),
        "qwen3": dict(num_key_value_heads=2, head_dim=16),
        "gemma": dict(num_key_value_heads=2, head_dim=16),
        "gemma2": dict(num_key_value_heads=2, head_dim=16, sliding_window=4, attn_logit_softcapping=50.0),
        "gemma3_text": dict(num_key_value_heads=2, head_dim=16, sliding_window=4, layer_types=None,
                            sliding_window_pattern=2),
        "bloom": dict(n_layer=2, n_head=4),
        "falcon": dict(new_decoder_architecture=False, multi_query=False, alibi=True, parallel_attn=False,
                       bias=True),
        "glm": dict(num_key_value_heads=2, head_dim=16),
        "mamba": dict(state_size=8, expand=2, conv_kernel=4),
        "bart": dict(d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                     decoder_start_token_id=3, forced_eos_token_id=None),
        "t5": dict(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                   relative_attention_num_buckets=8, relative_attention_max_distance=16, decoder_start_token_id=0),
        "mixtral": dict(num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2),
        "qwen2_moe": dict(num_key_value_heads=2, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                          shared_expert_intermediate_size=64),
        "qwen3_moe": dict(num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32),
    }
    extra["mbart"] = extra["plbart"] = extra["bart"]
    extra["mt5"] = extra["t5"]
    kw.update(extra.get(model_type, {}))
    if model_type == "mamba":  # a state-space model: no heads
        kw.pop("num_attention_heads")
    if model_type in ("funnel", "xlnet"):  # layers from block_sizes / n_layer; xlnet has no position limit
        kw.pop("num_hidden_layers")
        kw.pop("max_position_embeddings")
    kw.update(overrides)
    if model_type == "gemma3_text":
        kw.pop("sliding_window_pattern")
        kw["layer_types"] = ["sliding_attention", "full_attention"]
    return tf.AutoConfig.for_model(model_type, **kw)


def build(model_type: str, dtype=torch.float64, seed: int = 0, spread: float = 1.5, **overrides):
    """(model, lm): the tiny model of ``model_type`` in ``dtype``, a sequence classifier where
    transformers has one, else a causal language model (lm True); its random weights times
    ``spread``."""
    config = config_for(model_type, **overrides)
    torch.manual_seed(seed)
    try:
        model, lm = tf.AutoModelForSequenceClassification.from_config(config), False
    except ValueError:
        model, lm = tf.AutoModelForCausalLM.from_config(config), True
    with torch.no_grad():  # random init leaves the classifier nearly uniform: spread it
        for p in model.parameters():
            p.mul_(spread)
    return model.to(dtype).eval(), lm


# -- the independent reference -------------------------------------------------------------
class _Intercept:
    """Routes softmax calls made inside a site's scope module to the reference's state."""

    def __init__(self):
        self.current = None  # the site whose scope is running
        self.taken = 0  # attention softmaxes seen in this call of the scope
        self.per_call = 1  # attention softmaxes per call (Longformer: local, then global)
        self.leaves = {}
        self.busy = False
        self.mode = "record"
        self.probs = {}
        self.target = None
        self.alphas = None
        self.leaf = None

    def softmax(self, original, x, dim, dtype):
        last = dim is None or dim in (-1, x.dim() - 1)  # attention normalises over keys, the last axis
        # (ConvBERT's dynamic convolution normalises its kernel over dim 1: not an attention map)
        if self.busy or self.current is None or self.taken >= self.per_call or x.dim() < 3 or not last:  # as asked
            return original(x.to(dtype) if dtype is not None else x, dim)
        self.busy = True  # functional softmax calls Tensor.softmax: one interception per call
        try:
            out = original(x if x.dtype == torch.float64 or dtype is None else x.to(dtype), dim)
        finally:
            self.busy = False
        part = (self.current, self.taken)
        self.taken += 1
        if self.mode == "record":
            self.probs[part] = out.detach()
        elif part[0] == self.target:
            base = self.probs[part]  # [rows of one example (1, or heads where folded into the batch), ...]
            rows = base.shape[0]
            alphas = self.alphas.to(base).repeat_interleave(rows).view(-1, *[1] * (base.dim() - 1))
            leaf = (alphas * base.repeat(len(self.alphas), *[1] * (base.dim() - 1))).requires_grad_(True)
            self.leaves[part] = leaf
            return leaf
        return out


@contextlib.contextmanager
def _patched(state: _Intercept):
    f_soft, t_soft, m_soft = torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax

    def fsoft(x, dim=None, _stacklevel=3, dtype=None):
        return state.softmax(lambda t, d: f_soft(t, dim=d), x, dim, dtype)

    def tsoft(x, dim, dtype=None):
        return state.softmax(lambda t, d: t_soft(t, d), x, dim, dtype)

    def msoft(x, dim, dtype=None):
        return state.softmax(lambda t, d: m_soft(t, d), x, dim, dtype)

    torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax = fsoft, tsoft, msoft
    try:
        yield
    finally:
        torch.nn.functional.softmax, torch.softmax, torch.Tensor.softmax = f_soft, t_soft, m_soft


def scopes(model) -> dict:
    """site -> the module whose forward holds that site's attention softmax, or for a layer
    shared by every layer (ALBERT) the shared module with the site of each call in order."""
    mt = model.config.model_type
    if mt == "albert":
        shared = [layer.attention for group in model.albert.encoder.albert_layer_groups for layer in group.albert_layers]
        return {"shared": (shared, [("self", i) for i in range(model.config.num_hidden_layers)])}
    if mt in ("t5", "mt5", "umt5"):
        base = getattr(model, "transformer", model)
        out = {("encoder", i): b.layer[0] for i, b in enumerate(base.encoder.block)}
        out.update({("decoder", i): b.layer[0] for i, b in enumerate(base.decoder.block)})
        out.update({("cross", i): b.layer[1] for i, b in enumerate(base.decoder.block)})
        return out
    if mt == "t5gemma":
        base = model.model
        out = {("encoder", i): layer.self_attn for i, layer in enumerate(base.encoder.layers)}
        out.update({("decoder", i): layer.self_attn for i, layer in enumerate(base.decoder.layers)})
        out.update({("cross", i): layer.cross_attn for i, layer in enumerate(base.decoder.layers)})
        return out
    if mt in ("bart", "mbart", "plbart", "mvp", "bigbird_pegasus"):
        base = model.model
        out = {("encoder", i): layer.self_attn for i, layer in enumerate(base.encoder.layers)}
        out.update({("decoder", i): layer.self_attn for i, layer in enumerate(base.decoder.layers)})
        out.update({("cross", i): layer.encoder_attn for i, layer in enumerate(base.decoder.layers)})
        return out
    n = model.config.num_hidden_layers if hasattr(model.config, "num_hidden_layers") else model.config.n_layer
    lists = [m for _, m in model.named_modules() if isinstance(m, torch.nn.ModuleList) and len(m) == n]
    layers = lists[0]
    return {("self", i): layer for i, layer in enumerate(layers)}


@contextlib.contextmanager
def _scoped(model, state: _Intercept):
    hooks = []

    def enter(site):
        def pre(mod, args, kwargs=None):
            state.current, state.taken = site, 0
        return pre

    def leave(mod, args, out):
        state.current = None

    calls = {"n": 0}
    for key, value in scopes(model).items():
        if key == "shared":  # the shared modules are called once per layer, in order
            modules, sites = value

            def pre(mod, args, _sites=sites):
                state.current, state.taken = _sites[calls["n"] % len(_sites)], 0
                calls["n"] += 1
            for module in modules:
                hooks.append(module.register_forward_pre_hook(pre))
                hooks.append(module.register_forward_hook(leave))
        else:
            hooks.append(value.register_forward_pre_hook(enter(key)))
            hooks.append(value.register_forward_hook(leave))
    try:
        yield
    finally:
        for h in hooks:
            h.remove()


def reference(model, inputs: dict, alphas, weights, target: int | None = None, lm: bool = False,
              f_of_logits=None):
    """{site: Attr [heads, n_q, n_k]} by the definition, with the model's own eager attention;
    also the predicted class (or next token) used as the target. ``inputs``: the model inputs
    of one example (lists of ids), as attattr gives them to the model. ``f_of_logits``: F per
    batch row from the logits, where it is not the target's probability."""
    inputs = {k: torch.tensor([v]) for k, v in inputs.items()}
    impl = {}
    for mod in model.modules():
        cfg = getattr(mod, "config", None)
        if cfg is not None and hasattr(cfg, "_attn_implementation") and id(cfg) not in impl:
            impl[id(cfg)] = (cfg, cfg._attn_implementation)
            cfg._attn_implementation = "eager"
    experts = getattr(model.config, "_experts_implementation", None)
    if experts not in (None, "eager"):  # grouped experts take no float64
        model.set_experts_implementation("eager")
    # no cache, where the model's forward takes the flag (T5Gemma's classifier sets it itself)
    no_cache = {"use_cache": False} if "use_cache" in inspect.signature(model.forward).parameters else {}
    state = _Intercept()
    state.per_call = 2 if model.config.model_type == "longformer" else 1
    try:
        with _patched(state), _scoped(model, state):
            with torch.no_grad():
                logits = model(**inputs, **no_cache).logits
            last = logits[0, -1] if lm else logits[0]
            target = int(last.argmax()) if target is None else target
            result = {}
            sites = sorted({site for site, _ in state.probs})
            for site in sites:
                state.mode, state.target, state.leaves = "attr", site, {}
                state.alphas = torch.as_tensor(alphas, dtype=torch.float64)
                batch = {k: v.expand(len(alphas), -1) for k, v in inputs.items()}
                with torch.enable_grad():
                    out = model(**batch, **no_cache).logits
                    if f_of_logits is not None:
                        f = f_of_logits(out.double())
                    else:
                        out = (out[:, -1] if lm else out).double()
                        f = torch.softmax(out, -1)[:, target]
                    parts = sorted(state.leaves)
                    grads = torch.autograd.grad((f * torch.as_tensor(weights, dtype=f.dtype)).sum(),
                                                [state.leaves[p] for p in parts])
                attr = {p: (state.probs[p] * g.view(len(alphas), *state.probs[p].shape).sum(0)).detach()
                        for p, g in zip(parts, grads)}
                first = attr[(site, 0)]  # [1, head, q, k], or [head, q, k] where heads are folded into the batch
                result[site] = (first[0] if first.dim() == 4 else first) if len(attr) == 1 \
                    else _longformer_dense(model, inputs, attr, site)
                n_in = inputs["input_ids"].shape[1]
                if site[0] == "self" and result[site].shape[-1] == n_in + 1:
                    # an attention sink: the softmax ran over the keys and the sink logit, whose
                    # column the model drops (its gradient, so its attribution, is 0)
                    assert not result[site][..., -1].any()
                    result[site] = result[site][..., :-1]
                state.mode = "record"
    finally:
        for cfg, old in impl.values():
            cfg._attn_implementation = old
        if experts not in (None, "eager"):
            model.set_experts_implementation(experts)
    return result, target


def _longformer_dense(model, inputs, attr, site) -> torch.Tensor:
    """Longformer's two attention parts as one [heads, n, n] map: the local part is banded,
    [1, n, heads, globals + 2w + 1] (the global keys' columns first, then key i - w + t), the
    global part [heads, globals, n] for the global tokens' rows."""
    local, glob = attr[(site, 0)][0], attr[(site, 1)]
    n, heads = local.shape[0], local.shape[1]
    window = model.config.attention_window
    w = (window if isinstance(window, int) else window[site[1]]) // 2  # a window per layer, or one
    mask = inputs.get("global_attention_mask")
    global_idx = [0] if mask is None else [int(i) for i in torch.nonzero(mask[0]).flatten()]
    n_glob = len(global_idx)
    dense = torch.zeros(heads, n, n, dtype=local.dtype)
    for i in range(n):
        for c, j in enumerate(global_idx):
            dense[:, i, j] += local[i, :, c]
        for t in range(2 * w + 1):
            j = i - w + t
            if 0 <= j < n:
                dense[:, i, j] += local[i, :, n_glob + t]
    glob = glob.reshape(heads, n_glob, n)
    for c, i in enumerate(global_idx):
        dense[:, i, :] = glob[:, c, :]
    n_in = inputs["input_ids"].shape[1]  # the model padded its input to a multiple of the window
    return dense[:, :n_in, :n_in]
