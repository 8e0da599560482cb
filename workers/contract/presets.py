"""Model presets: plain data, shared by the spec (no torch) and the engine's model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # What the family's published models fix (None: the engine's defaults).
    head_dim: int | None = None
    ffn_dim: int | None = None
    norm_eps: float | None = None
    rope_theta: float | None = None
    tie_embeddings: bool = False
    rope_scaling: dict[str, Any] | None = None


_LLAMA3_ROPE: dict[str, Any] = {
    "rope_type": "llama3",
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}
_QWEN: dict[str, Any] = {"rope_theta": 1e6, "norm_eps": 1e-6}

PRESETS: dict[str, Preset] = {
    # Small enough to train on a laptop CPU in seconds; byte-level vocabulary.
    "tiny": Preset(128, 4, 4, 2, 256, 128, ffn_multiple_of=32),
    "125m": Preset(768, 12, 12, 12, 32000, 2048),
    "350m": Preset(1024, 24, 16, 8, 32000, 2048),
    # 1b and 3b follow Llama 3.2's shapes, 8b Llama 3's; vocabularies as listed.
    "1b": Preset(2048, 16, 32, 8, 32000, 2048, ffn_multiplier=1.5),
    "3b": Preset(3072, 28, 24, 8, 32000, 2048),
    "8b": Preset(4096, 32, 32, 8, 128256, 2048, ffn_multiplier=1.3, ffn_multiple_of=1024),
    # The published shapes of open models, to train a family from scratch (init_from reads
    # them from the folder instead). seq_len is the training context, not the model's most.
    "llama3.2-1b": Preset(
        2048,
        16,
        32,
        8,
        128256,
        2048,
        ffn_dim=8192,
        head_dim=64,
        rope_theta=500000.0,
        tie_embeddings=True,
        rope_scaling=_LLAMA3_ROPE | {"factor": 32.0},
    ),
    "llama3.2-3b": Preset(
        3072,
        28,
        24,
        8,
        128256,
        2048,
        ffn_dim=8192,
        head_dim=128,
        rope_theta=500000.0,
        tie_embeddings=True,
        rope_scaling=_LLAMA3_ROPE | {"factor": 32.0},
    ),
    "llama3.1-8b": Preset(
        4096,
        32,
        32,
        8,
        128256,
        2048,
        ffn_dim=14336,
        rope_theta=500000.0,
        rope_scaling=_LLAMA3_ROPE | {"factor": 8.0},
    ),
    "qwen2.5-0.5b": Preset(
        896, 24, 14, 2, 151936, 2048, family="qwen2", ffn_dim=4864, **_QWEN, tie_embeddings=True
    ),
    "qwen2.5-1.5b": Preset(
        1536, 28, 12, 2, 151936, 2048, family="qwen2", ffn_dim=8960, **_QWEN, tie_embeddings=True
    ),
    "qwen2.5-7b": Preset(3584, 28, 28, 4, 152064, 2048, family="qwen2", ffn_dim=18944, **_QWEN),
    "qwen3-0.6b": Preset(
        1024,
        28,
        16,
        8,
        151936,
        2048,
        family="qwen3",
        ffn_dim=3072,
        head_dim=128,
        **_QWEN,
        tie_embeddings=True,
    ),
    "qwen3-1.7b": Preset(
        2048,
        28,
        16,
        8,
        151936,
        2048,
        family="qwen3",
        ffn_dim=6144,
        head_dim=128,
        **_QWEN,
        tie_embeddings=True,
    ),
    "qwen3-8b": Preset(
        4096, 36, 32, 8, 151936, 2048, family="qwen3", ffn_dim=12288, head_dim=128, **_QWEN
    ),
    "mistral-7b": Preset(
        4096, 32, 32, 8, 32768, 2048, family="mistral", ffn_dim=14336, rope_theta=1e6
    ),
}


def ffn_hidden_dim(dim: int, multiplier: float, multiple_of: int) -> int:
    """Width of the SwiGLU hidden layer, as Llama computes it."""
    hidden = int(8 * dim / 3 * multiplier)
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)
