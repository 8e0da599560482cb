"""Hugging Face Llama config.json <-> the JobSpec's model fields.

No torch here: the API reads an `init_from` folder's config.json when a job is submitted,
fills the spec's model fields from it (a field the user gave must agree), and stores that
resolved spec, so the scheduler, the workers and every later reader see the real shape.
The worker reads config.json again when it loads the weights (workers/engine/hf_weights.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from workers.contract.data_access import DataAccess
from workers.contract.sections import INIT_FROM
from workers.contract.spec import JobSpec

CONFIG = "config.json"
# Read on the API's request path: a config.json is a few KiB, and a bigger file is not
# one (a huge one would hold the request and the server's memory).
CONFIG_LIMIT_BYTES = 1024 * 1024
TOKENIZER = "tokenizer.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"

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


class InitFromError(ValueError):
    """An `init_from` folder this model cannot start from; `field` names the spec field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message


def read_config(folder: Path, access: DataAccess) -> dict[str, Any]:
    """The folder's config.json, opened through `access` (inside the data roots)."""
    path = folder / CONFIG
    if not path.is_file():
        raise InitFromError(
            "model.init_from",
            f"{folder} has no {CONFIG}; give a Hugging Face Llama folder (save_pretrained)",
        )
    with access.open(path, "model.init_from") as handle:
        raw = handle.read(CONFIG_LIMIT_BYTES + 1)
    if len(raw) > CONFIG_LIMIT_BYTES:
        raise InitFromError(
            "model.init_from",
            f"{path} is larger than {CONFIG_LIMIT_BYTES // 1024} KiB; a Llama config.json is "
            "a few KiB (is it the right file?)",
        )
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InitFromError("model.init_from", f"{path} is not JSON") from None
    if not isinstance(config, dict):
        raise InitFromError("model.init_from", f"{path} is not a JSON object")
    return config


def _rope_theta(config: dict[str, Any]) -> Any:
    # transformers 5 moved rope_theta into rope_parameters; 4.x keeps it at the top level.
    params = config.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        return params["rope_theta"]
    return config.get("rope_theta", 10000.0)


def _check_llama(config: dict[str, Any]) -> None:
    """Refuse configs this engine's model does not compute exactly."""
    field = "model.init_from"
    model_type = config.get("model_type")
    if model_type != "llama":
        raise InitFromError(
            field, f"config.json has model_type={model_type!r}; only 'llama' models load"
        )
    if config.get("hidden_act", "silu") != "silu":
        raise InitFromError(field, f"hidden_act={config.get('hidden_act')!r} is not 'silu'")
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            raise InitFromError(field, f"{flag}=true is not supported (no biases here)")
    for key in ("rope_scaling", "rope_parameters"):
        rope = config.get(key)
        if isinstance(rope, dict) and rope.get("rope_type", rope.get("type", "default")) not in (
            "default",
            None,
        ):
            raise InitFromError(field, f"{key} {rope!r} is not supported (plain RoPE only)")
    heads, dim = config.get("num_attention_heads"), config.get("hidden_size")
    head_dim = config.get("head_dim")
    if (
        head_dim is not None
        and isinstance(heads, int)
        and isinstance(dim, int)
        and heads > 0
        and head_dim != dim // heads
    ):
        raise InitFromError(field, f"head_dim={head_dim} is not hidden_size/num_attention_heads")


def shape_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec field -> value, from a Llama config.json."""
    _check_llama(config)
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
        if not numeric or (field not in ("norm_eps", "rope_theta") and not isinstance(value, int)):
            raise InitFromError("model.init_from", f"config.json {key}={value!r} is not a number")
        shape[field] = value
    return shape


def _agrees(given: Any, value: Any) -> bool:
    if isinstance(given, float) or isinstance(value, float):
        return math.isclose(float(given), float(value), rel_tol=1e-9)
    return bool(given == value)


def resolve_init_from(spec: JobSpec, access: DataAccess) -> JobSpec:
    """The spec with its model shape read from `model.init_from`'s config.json and
    `data.tokenizer: init_from` replaced by the tokenizer.json beside it.

    Raises InitFromError (a field the user gave disagrees, the folder is not a Llama
    model) or pydantic's ValidationError (the shape does not fit the layout).
    """
    if spec.model.init_from is None:
        return spec
    folder = Path(spec.model.init_from)
    shape = shape_from_config(read_config(folder, access))
    if not any(folder.glob("*.safetensors")):
        raise InitFromError("model.init_from", f"{folder} holds no *.safetensors weights")
    data = spec.model_dump(mode="json")
    for field, value in shape.items():
        given = data["model"].get(field)
        if given is not None and not _agrees(given, value):
            key = next(k for k, f in SHAPE_KEYS.items() if f == field)
            raise InitFromError(
                f"model.{field}",
                f"{given} disagrees with {folder}/{CONFIG} ({key}={value}); "
                f"remove model.{field} or set it to {value}",
            )
        data["model"][field] = value
    if spec.data.tokenizer == INIT_FROM:
        tokenizer = folder / TOKENIZER
        if not tokenizer.is_file():
            raise InitFromError(
                "data.tokenizer", f"{folder} has no {TOKENIZER}; name a tokenizer file instead"
            )
        access.check(tokenizer, "data.tokenizer")
        data["data"]["tokenizer"] = str(tokenizer)
    return JobSpec.model_validate(data)


def llama_config(
    resolved: dict[str, Any], *, bos_token_id: int | None, eos_token_id: int | None
) -> dict[str, Any]:
    """A config.json that transformers' LlamaForCausalLM loads with no custom code, for a
    model of `ModelSpec.resolved()`'s shape (untied embeddings, as this engine trains)."""
    return {
        "architectures": ["LlamaForCausalLM"],
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
