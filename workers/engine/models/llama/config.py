"""Llama's args, and its Hugging Face config.json in both directions. No torch here: the
control plane reads a config.json through this module when a job is submitted.

Qwen2, Qwen3 and Mistral are Llama's architecture with a few switches (biases on q/k/v,
norms on q/k, a sliding window), so their families reuse `ModelArgs` and `DecoderConfig`
with their own `model_type`, class name and switches.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
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
    # Channels per head; 0: dim // n_heads.
    head_dim: int = 0
    # The output head multiplies by the token embedding's weight (one tensor).
    tie_embeddings: bool = False
    # RopeScaling's fields (workers/contract/sections.py), or None for plain RoPE.
    rope_scaling: dict[str, Any] | None = None
    # Each position attends to at most this many positions, itself included.
    sliding_window: int | None = None
    # Family switches: biases on the q, k and v projections (Qwen2), RMSNorm on each
    # head's queries and keys before rope (Qwen3).
    qkv_bias: bool = False
    qk_norm: bool = False

    def __post_init__(self) -> None:
        if not self.head_dim:
            object.__setattr__(self, "head_dim", self.dim // self.n_heads)

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
    "head_dim": "head_dim",
    "tie_word_embeddings": "tie_embeddings",
    "rope_scaling": "rope_scaling",
    "sliding_window": "sliding_window",
}
_NUMBERS = (
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "intermediate_size",
    "head_dim",
)
_FIELD = "model.init_from"
ROPE_TYPES = ("default", "llama3", "linear")
_LLAMA3_KEYS = ("low_freq_factor", "high_freq_factor", "original_max_position_embeddings")


def _rope(config: dict[str, Any]) -> tuple[Any, dict[str, Any] | None]:
    """(rope_theta, RopeScaling's fields or None) of a config.json: transformers 5 keeps
    both in `rope_parameters`, 4.x keeps `rope_theta` at the top and `rope_scaling`."""
    params = config.get("rope_parameters")
    scaling = config.get("rope_scaling")
    rope = params if isinstance(params, dict) else scaling if isinstance(scaling, dict) else {}
    theta = rope.get("rope_theta", config.get("rope_theta", 10000.0))
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind in ("default", None):
        return theta, None
    key = "rope_parameters" if rope is params else "rope_scaling"
    if kind not in ROPE_TYPES:
        raise InitFromError(
            _FIELD,
            f"config.json {key}.rope_type={kind!r} is not computed here; the rope types "
            f"that load are {', '.join(repr(t) for t in ROPE_TYPES)}",
        )
    out: dict[str, Any] = {"rope_type": kind, "factor": rope.get("factor")}
    for name in _LLAMA3_KEYS:
        out[name] = rope.get(name) if kind == "llama3" else None
    missing = [k for k, v in out.items() if v is None and (kind == "llama3" or k == "factor")]
    if missing:
        raise InitFromError(_FIELD, f"config.json {key} has no {', '.join(missing)}")
    if kind == "llama3":
        out["original_max_position_embeddings"] = int(out["original_max_position_embeddings"])
    for name in ("factor", "low_freq_factor", "high_freq_factor"):
        if out[name] is not None:
            out[name] = float(out[name])
    return theta, out


@dataclass(frozen=True)
class DecoderConfig:
    """A Llama-like family's config.json <-> the spec's model fields."""

    name: str
    model_types: tuple[str, ...]
    architecture: str
    # Biases on the q, k and v projections (not o): Qwen2's, and no config key says so.
    qkv_bias: bool = False
    qk_norm: bool = False
    # config.json's `sliding_window` is applied to every layer (Mistral); elsewhere a
    # sliding window is switched by `use_sliding_window` / `layer_types`, which are refused.
    reads_sliding_window: bool = False
    shape_keys: dict[str, str] = field(default_factory=lambda: dict(SHAPE_KEYS))

    @property
    def fixed_args(self) -> dict[str, Any]:
        return {"qkv_bias": self.qkv_bias, "qk_norm": self.qk_norm}

    def _check(self, config: dict[str, Any]) -> None:
        """Refuse what this family does not compute exactly as transformers does."""
        if config.get("hidden_act", "silu") != "silu":
            raise InitFromError(_FIELD, f"hidden_act={config.get('hidden_act')!r} is not 'silu'")
        if config.get("attention_bias"):
            what = "q, k and v only (Qwen2)" if self.qkv_bias else "none"
            raise InitFromError(
                _FIELD,
                f"attention_bias=true is not supported for {self.name} (biases on q, k, v "
                f"and o); the biases computed here: {what}",
            )
        if config.get("mlp_bias"):
            raise InitFromError(_FIELD, "mlp_bias=true is not supported (no MLP biases here)")
        factor = config.get("partial_rotary_factor", 1.0)
        if factor not in (1, 1.0, None):
            raise InitFromError(
                _FIELD, f"partial_rotary_factor={factor!r} is not supported (whole heads rotate)"
            )
        layer_types = config.get("layer_types") or []
        windowed = config.get("use_sliding_window") or any(
            t != "full_attention" for t in layer_types
        )
        if windowed and not self.reads_sliding_window:
            raise InitFromError(
                _FIELD,
                f"use_sliding_window / layer_types: sliding-window layers are not supported "
                f"for {self.name} (every layer attends to the whole context here); set "
                "use_sliding_window to false",
            )

    def shape_from_hf(self, config: dict[str, Any]) -> dict[str, Any]:
        """ModelSpec field -> value, from a config.json of this family."""
        self._check(config)
        values = {key: config.get(key) for key in _NUMBERS}
        if values["num_key_value_heads"] is None:
            values["num_key_value_heads"] = values["num_attention_heads"]
        shape: dict[str, Any] = {}
        for key in _NUMBERS:
            value = values[key]
            if value is None and key == "head_dim":
                continue
            if not isinstance(value, int) or isinstance(value, bool):
                raise InitFromError(_FIELD, f"config.json {key}={value!r} is not a whole number")
            shape[SHAPE_KEYS[key]] = value
        eps = config.get("rms_norm_eps")
        theta, scaling = _rope(config)
        for key, value in (
            ("rms_norm_eps", eps if eps is not None else 1e-6),
            ("rope_theta", theta),
        ):
            if (
                not isinstance(value, int | float)
                or isinstance(value, bool)
                or not math.isfinite(value)
            ):
                raise InitFromError(_FIELD, f"config.json {key}={value!r} is not a number")
            shape[SHAPE_KEYS[key]] = float(value)
        shape["tie_embeddings"] = bool(config.get("tie_word_embeddings", False))
        shape["rope_scaling"] = scaling
        window = config.get("sliding_window") if self.reads_sliding_window else None
        if window is not None and not (isinstance(window, int) and window > 0):
            raise InitFromError(_FIELD, f"config.json sliding_window={window!r} is not a count")
        shape["sliding_window"] = window
        return shape

    def hf_config(
        self, resolved: dict[str, Any], *, bos_token_id: int | None, eos_token_id: int | None
    ) -> dict[str, Any]:
        """A config.json that transformers' class for this family loads with no custom
        code, for a model of `ModelSpec.resolved()`'s shape."""
        rope: dict[str, Any] = {"rope_type": "default"}
        if resolved.get("rope_scaling"):
            rope = {k: v for k, v in resolved["rope_scaling"].items() if v is not None}
        config: dict[str, Any] = {
            "architectures": [self.architecture],
            "model_type": self.model_types[0],
            "hidden_size": resolved["dim"],
            "num_hidden_layers": resolved["n_layers"],
            "num_attention_heads": resolved["n_heads"],
            "num_key_value_heads": resolved["n_kv_heads"],
            "head_dim": resolved.get("head_dim") or resolved["dim"] // resolved["n_heads"],
            "intermediate_size": resolved["ffn_dim"],
            "vocab_size": resolved["vocab_size"],
            # Read by no rope type computed here: the context the model was made for.
            "max_position_embeddings": max(
                resolved["seq_len"],
                int(rope.get("original_max_position_embeddings", 0) * rope.get("factor", 1)),
            ),
            "rms_norm_eps": resolved.get("norm_eps", 1e-5),
            "rope_theta": resolved.get("rope_theta", 10000.0),
            "rope_parameters": {**rope, "rope_theta": resolved.get("rope_theta", 10000.0)},
            "rope_scaling": None if rope["rope_type"] == "default" else rope,
            "hidden_act": "silu",
            "tie_word_embeddings": bool(resolved.get("tie_embeddings", False)),
            "initializer_range": 0.02,
            "bos_token_id": bos_token_id,
            "eos_token_id": eos_token_id,
            "torch_dtype": "float32",
        }
        if not self.qkv_bias:
            config["attention_bias"] = False
        if self.name == "llama":
            config["mlp_bias"] = False
        if self.reads_sliding_window:
            config["sliding_window"] = resolved.get("sliding_window")
        elif self.name != "llama":
            config["use_sliding_window"] = False
            config["sliding_window"] = None
        return config


CONFIG = DecoderConfig(name="llama", model_types=("llama",), architecture="LlamaForCausalLM")
