"""Model types attattr refuses at load_model, each with why (one line each)."""

from __future__ import annotations

from . import refuse

refuse("funnel", "the Funnel Transformer pools the sequence between its blocks, so its layers attend over"
                 " different numbers of tokens (pooled queries over unpooled keys), which attattr's per-layer"
                 " token-by-token maps cannot hold")
refuse("diffllama", "differential attention computes two softmax maps per head and subtracts them"
                    " (softmax(Q1 K1^T) - lambda softmax(Q2 K2^T)); attattr's map of a layer is one softmax and"
                    " would attribute the first alone")
