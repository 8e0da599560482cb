"""The qwen2 family as the engine builds it: Llama's module with qwen2's switches."""

from __future__ import annotations

from shardline.workers.engine.models.llama.family import decoder_family
from shardline.workers.engine.models.qwen2.config import CONFIG

FAMILY = decoder_family(CONFIG)
