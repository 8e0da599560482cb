"""The mistral family as the engine builds it: Llama's module with mistral's switches."""

from __future__ import annotations

from shardline.workers.engine.models.llama.family import decoder_family
from shardline.workers.engine.models.mistral.config import CONFIG

FAMILY = decoder_family(CONFIG)
