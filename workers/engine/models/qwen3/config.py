"""Qwen3: Llama's architecture with an RMSNorm on each head's queries and keys before rope,
and a head size of its own (`head_dim`, not hidden_size / num_attention_heads). No torch
here."""

from __future__ import annotations

from shardline.workers.engine.models.llama.config import DecoderConfig

CONFIG = DecoderConfig(
    name="qwen3", model_types=("qwen3",), architecture="Qwen3ForCausalLM", qk_norm=True
)
