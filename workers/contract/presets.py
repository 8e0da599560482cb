"""Model presets: plain data, shared by the spec (no torch) and the engine's model."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    # The MLP width follows the Llama rule: 8/3 * dim * multiplier, rounded up to multiple_of.
    ffn_multiplier: float = 1.0
    ffn_multiple_of: int = 256
    # The model family it builds (workers/engine/models/registry.py).
    family: str = "llama"


PRESETS: dict[str, Preset] = {
    # Small enough to train on a laptop CPU in seconds; byte-level vocabulary.
    "tiny": Preset(128, 4, 4, 2, 256, 128, ffn_multiple_of=32),
    "125m": Preset(768, 12, 12, 12, 32000, 2048),
    "350m": Preset(1024, 24, 16, 8, 32000, 2048),
    # 1b and 3b follow Llama 3.2's shapes, 8b Llama 3's; vocabularies as listed.
    "1b": Preset(2048, 16, 32, 8, 32000, 2048, ffn_multiplier=1.5),
    "3b": Preset(3072, 28, 24, 8, 32000, 2048),
    "8b": Preset(4096, 32, 32, 8, 128256, 2048, ffn_multiplier=1.3, ffn_multiple_of=1024),
}


def ffn_hidden_dim(dim: int, multiplier: float, multiple_of: int) -> int:
    """Width of the SwiGLU hidden layer, as Llama computes it."""
    hidden = int(8 * dim / 3 * multiplier)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
