"""Mistral: Llama's architecture under its own `model_type`, with a sliding window on every
layer where config.json gives one (each position attends to the `sliding_window` positions
up to itself). No torch here."""

from __future__ import annotations

from shardline.workers.engine.models.llama.config import DecoderConfig

CONFIG = DecoderConfig(
    name="mistral",
    model_types=("mistral",),
    architecture="MistralForCausalLM",
    reads_sliding_window=True,
)
