"""Qwen2 and Qwen2.5: Llama's architecture with biases on the q, k and v projections (not
on o), tied or untied embeddings. No torch here."""

from __future__ import annotations

from shardline.workers.engine.models.llama.config import DecoderConfig

CONFIG = DecoderConfig(
    name="qwen2", model_types=("qwen2",), architecture="Qwen2ForCausalLM", qkv_bias=True
)
