"""Model types attattr refuses at load_model, each with why (one line each)."""

from __future__ import annotations

from . import refuse

refuse("funnel", "the Funnel Transformer pools the sequence between its blocks, so its layers attend over"
                 " different numbers of tokens (pooled queries over unpooled keys), which attattr's per-layer"
                 " token-by-token maps cannot hold")
refuse("diffllama", "differential attention computes two softmax maps per head and subtracts them"
                    " (softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)); attattr's map of a layer is one softmax and"
                    " would attribute the first alone")
_APPROXIMATE = ("its attention is approximate ({how}), so there is no n x n softmax map whose attribution the model"
                " uses; attattr attributes exact softmax attention")
refuse("reformer", _APPROXIMATE.format(how="locality-sensitive hashing buckets and chunked local attention"))
refuse("nystromformer", _APPROXIMATE.format(how="the Nystrom approximation of the softmax through landmarks"))
refuse("yoso", _APPROXIMATE.format(how="Bernoulli sampling of hashed keys (You Only Sample Almost Once)"))
refuse("mra", _APPROXIMATE.format(how="multi-resolution block approximation"))
refuse("perceiver", "its layers attend from a fixed array of latents, not from the input tokens (cross-attention"
                    " from latents to inputs, then latent self-attention), so no layer has a token-by-token map")
refuse("deepseek_v4", "its compressed attention layers attend to keys that each summarise several tokens (compressed"
                      " sparse and heavily compressed attention), so their maps are not token by token")
refuse("longcat_flash", "each of its layers runs two attention blocks, and attattr's map of a layer is one softmax")
refuse("rwkv", "its time mixing is a recurrence (a linear, decaying sum over past tokens), not softmax attention")
refuse("tapas", "it reads tables (seven token type ids per token: segment, column, row, rank, ...), which"
                " attattr's text inputs do not give")
refuse("squeezebert", "its encoder calls each layer's forward directly, past the module hooks with which attattr"
                      " records and replays layers; not supported yet")
refuse("canine", "its deep stack attends over downsampled blocks of characters, not over the input's tokens, and"
                 " its character encoders attend locally")
refuse("lilt", "it reads layout boxes beside the text, with a second attention stream over them whose scores"
               " are added to the text's")
refuse("prophetnet", "its decoder runs n-gram predicting streams beside the main stream in every layer")
refuse("xlm", "it keeps its layers as parallel lists (attentions, feed-forwards), which attattr's per-layer"
              " replay does not follow yet")
refuse("flaubert", "it keeps its layers as parallel lists (attentions, feed-forwards), which attattr's per-layer"
                   " replay does not follow yet")
refuse("hrm_text", "it runs its blocks in nested recurrent cycles, so one layer's attention runs many times per"
                   " forward")
refuse("cpmant", "it puts learned prompt tokens before the input inside the model, so its layers attend over more"
                 " positions than the input has tokens")
