"""Random Hugging Face Llama models for the import/export tests (needs transformers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

TINY_LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 96,
    "vocab_size": 256,
    "max_position_embeddings": 64,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


def save_random_llama(
    folder: Path, seed: int = 0, max_shard_size: str = "5GB", **overrides: Any
) -> Any:
    """A random LlamaForCausalLM saved with save_pretrained into `folder`; returns it.

    Norm weights are randomised too (transformers starts them at 1), so a norm loaded
    into the wrong place shows in the logits.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**{**TINY_LLAMA, **overrides})
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=max_shard_size)
    return model
