"""Random Hugging Face models of each family for the import/export tests (needs
transformers): built from transformers' own config classes, no download."""

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


# One tiny model of each family, each switch it has turned on: Llama 3.1's rope scaling
# (a short original context, so the low, middle and high frequencies all occur), tied
# embeddings and a head size of its own; Qwen2's q/k/v biases with tied embeddings;
# Qwen3's q/k norms with head_dim != hidden_size / heads; Mistral's sliding window
# shorter than the sequences the tests feed.
SHORT_LLAMA3_ROPE: dict[str, Any] = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}
TINY_FAMILIES: dict[str, dict[str, Any]] = {
    "llama": {
        **TINY_LLAMA,
        "head_dim": 32,
        "tie_word_embeddings": True,
        "rope_scaling": SHORT_LLAMA3_ROPE,
    },
    "qwen2": {**TINY_LLAMA, "tie_word_embeddings": True, "rope_theta": 1e6, "rms_norm_eps": 1e-6},
    "qwen3": {**TINY_LLAMA, "head_dim": 32, "rope_theta": 1e6, "rms_norm_eps": 1e-6},
    "mistral": {**TINY_LLAMA, "sliding_window": 8},
}


def save_random_model(family: str, folder: Path, seed: int = 0, **overrides: Any) -> Any:
    """A random transformers model of `family` (TINY_FAMILIES' config), saved with
    save_pretrained into `folder`; returns it. Norm gains and biases are random too
    (transformers starts them at one and zero), so one put in the wrong place shows."""
    import transformers

    classes = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    config_class, model_class = classes[family]
    torch.manual_seed(seed)
    config = config_class(**{**TINY_FAMILIES[family], **overrides})
    model = model_class(config).float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(".bias"):
                p.normal_(std=0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return model
