"""Llama's args, and its Hugging Face config.json in both directions. No torch here: the
control plane reads a config.json through this module when a job is submitted."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from shardline.workers.contract.hf_errors import InitFromError


@dataclass(frozen=True)
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    vocab_size: int
    seq_len: int
    ffn_dim: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @classmethod
    def from_resolved(cls, resolved: dict[str, Any]) -> ModelArgs:
        """Build from `ModelSpec.resolved()`."""
        return cls(**resolved)


# config.json key -> ModelSpec field, for the fields that define the shape.
SHAPE_KEYS = {
    "hidden_size": "dim",
    "num_hidden_layers": "n_layers",
    "num_attention_heads": "n_heads",
    "num_key_value_heads": "n_kv_heads",
    "vocab_size": "vocab_size",
    "intermediate_size": "ffn_dim",
    "rms_norm_eps": "norm_eps",
    "rope_theta": "rope_theta",
}
_FIELD = "model.init_from"


def _rope_theta(config: dict[str, Any]) -> Any:
    # transformers 5 moved rope_theta into rope_parameters; 4.x keeps it at the top level.
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return config.get("rope_theta", 10000.0)


def _check(config: dict[str, Any]) -> None:
    """Refuse configs this model does not compute exactly."""
    if config.get("hidden_act", "silu") != "silu":
        raise InitFromError(_FIELD, f"hidden_act={config.get('hidden_act')!r} is not 'silu'")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise InitFromError(_FIELD, f"{flag}=true is not supported (no biases here)")
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in (
            "default",
            None,
        ):
            raise InitFromError(_FIELD, f"{key} {rope!r} is not supported (plain RoPE only)")
    heads, dim = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim")
    if (
        head_dim is not None
        and isinstance(heads, int)
        and isinstance(dim, int)
        and heads > 0
        and head_dim != dim // heads
    ):
        raise InitFromError(_FIELD, f"head_dim={head_dim} is not hidden_size/num_attention_heads")


class LlamaConfig:
    """Llama's config.json <-> the spec's model fields."""

    name = "llama"
    model_types: tuple[str, ...] = ("llama",)
    architecture = "LlamaForCausalLM"
    shape_keys: dict[str, str] = SHAPE_KEYS

    def shape_from_hf(self, config: dict[str, Any]) -> dict[str, Any]:
        """ModelSpec field -> value, from a Llama config.json."""
        _check(config)
        values = {key: config.get(key) for key in SHAPE_KEYS}
        values["rope_theta"] = _rope_theta(config)
        if values["num_key_value_heads"] is None:
            values["num_key_value_heads"] = values["num_attention_heads"]
        if values["rms_norm_eps"] is None:
            values["rms_norm_eps"] = 1e-6
        shape: dict[str, Any] = {}
        for key, field in SHAPE_KEYS.items():
            value = values[key]
            numeric = isinstance(value, int | float) and not isinstance(value, bool)
            integral = field in ("norm_eps", "rope_theta") or isinstance(value, int)
            if not numeric or not integral:
                raise InitFromError(_FIELD, f"config.json {key}={value!r} is not a number")
            shape[field] = value
        return shape

    def hf_config(
        self, resolved: dict[str, Any], *, bos_token_id: int | None, eos_token_id: int | None
    ) -> dict[str, Any]:
        """A config.json that transformers' LlamaForCausalLM loads with no custom code, for
        a model of `ModelSpec.resolved()`'s shape (untied embeddings, as this engine
        trains)."""
        return {
            "architectures": [self.architecture],
            "model_type": "llama",
            "hidden_size": resolved["dim"],
            "num_hidden_layers": resolved["n_layers"],
            "num_attention_heads": resolved["n_heads"],
            "num_key_value_heads": resolved["n_kv_heads"],
            "head_dim": resolved["dim"] // resolved["n_heads"],
            "intermediate_size": resolved["ffn_dim"],
            "vocab_size": resolved["vocab_size"],
            "max_position_embeddings": resolved["seq_len"],
            "rms_norm_eps": resolved.get("norm_eps", 1e-5),
            "rope_theta": resolved.get("rope_theta", 10000.0),
            "rope_scaling": None,
            "hidden_act": "silu",
            "attention_bias": False,
            "mlp_bias": False,
            "tie_word_embeddings": False,
            "initializer_range": 0.02,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "torch_dtype": "float32",
        }


CONFIG = LlamaConfig()
