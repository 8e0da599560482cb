"""The qwen3 family as the engine builds it: Llama's module with qwen3's switches."""

from __future__ import annotations

from shardline.workers.engine.models.llama.family import decoder_family
from shardline.workers.engine.models.qwen3.config import CONFIG

FAMILY = decoder_family(CONFIG)
