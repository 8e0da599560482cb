"""A Hugging Face folder's config.json -> the JobSpec's model fields, through the model
family that reads its `model_type` (workers/engine/models/registry.py).

No torch here, nor in the families' config adapters: the API reads an `init_from`
folder's config.json when a job is submitted, fills the spec's model fields from it (a
field the user gave must agree), and stores that resolved spec, so the scheduler, the
workers and every later reader see the real shape. The worker reads config.json again
when it loads the weights (workers/engine/hf_weights.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_errors import InitFromError
from shardline.workers.contract.sections import INIT_FROM
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.models.registry import (
    family_config,
    family_of_model_type,
    model_types,
)

CONFIG = "config.json"
# Read on the API's request path: a config.json is a few KiB, and a bigger file is not
# one (a huge one would hold the request and the server's memory).
CONFIG_LIMIT_BYTES = 1024 * 1024
TOKENIZER = "tokenizer.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"

__all__ = ["InitFromError", "read_config", "resolve_init_from", "shape_from_config"]


def read_config(folder: Path, access: DataAccess) -> dict[str, Any]:
    """The folder's config.json, opened through `access` (inside the data roots)."""
    path = folder / CONFIG
    if not path.is_file():
        raise InitFromError(
            "model.init_from",
            f"{folder} has no {CONFIG}; give a Hugging Face model folder (save_pretrained)",
        )
    with access.open(path, "model.init_from") as handle:
        raw = handle.read(CONFIG_LIMIT_BYTES + 1)
    if len(raw) > CONFIG_LIMIT_BYTES:
        raise InitFromError(
            "model.init_from",
            f"{path} is larger than {CONFIG_LIMIT_BYTES // 1024} KiB; a config.json is "
            "a few KiB (is it the right file?)",
        )
    try:
        config = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InitFromError("model.init_from", f"{path} is not JSON") from None
    if not isinstance(config, dict):
        raise InitFromError("model.init_from", f"{path} is not a JSON object")
    return config


def family_of_config(config: dict[str, Any]) -> str:
    """The model family that reads this config.json (its `model_type`)."""
    model_type = config.get("model_type")
    family = family_of_model_type(model_type)
    if family is None:
        raise InitFromError(
            "model.init_from",
            f"config.json has model_type={model_type!r}; the model types that load are "
            f"{', '.join(repr(t) for t in model_types())}",
        )
    return family


def shape_from_config(config: dict[str, Any]) -> dict[str, Any]:
    """ModelSpec field -> value, from a config.json of any family this engine has."""
    return family_config(family_of_config(config)).shape_from_hf(config)


def _agrees(given: Any, value: Any) -> bool:
    if isinstance(given, dict) and isinstance(value, dict):
        return given.keys() == value.keys() and all(_agrees(given[k], value[k]) for k in given)
    if isinstance(given, bool) or isinstance(value, bool) or given is None or value is None:
        return bool(given == value)
    if isinstance(given, float) or isinstance(value, float):
        return math.isclose(float(given), float(value), rel_tol=1e-9)
    return bool(given == value)


def resolve_init_from(spec: JobSpec, access: DataAccess) -> JobSpec:
    """The spec with its model shape read from `model.init_from`'s config.json and
    `data.tokenizer: init_from` replaced by the tokenizer.json beside it.

    Raises InitFromError (a field the user gave disagrees, the folder is not a model
    of a family this engine has) or pydantic's ValidationError (the shape does not fit the layout).
    """
    if spec.model.init_from is None:
        return spec
    folder = Path(spec.model.init_from)
    config = read_config(folder, access)
    family = family_of_config(config)
    adapter = family_config(family)
    shape = adapter.shape_from_hf(config)
    if not any(folder.glob("*.safetensors")):
        raise InitFromError("model.init_from", f"{folder} holds no *.safetensors weights")
    data = spec.model_dump(mode="json")
    if spec.model.family is not None and spec.model.family != family:
        raise InitFromError(
            "model.family",
            f"{spec.model.family!r} disagrees with {folder}/{CONFIG} "
            f"(model_type={config.get('model_type')!r}: the {family} family); remove "
            "model.family",
        )
    data["model"]["family"] = family
    for field, value in shape.items():
        given = data["model"].get(field)
        if field == "tie_embeddings" and given is False:
            continue  # untying is allowed: the head starts as the embedding, trained apart
        if given is not None and not _agrees(given, value):
            key = next((k for k, f in adapter.shape_keys.items() if f == field), field)
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
