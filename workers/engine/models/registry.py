"""Which model families exist, by name, Hugging Face `model_type` and preset.

A family is one folder under workers/engine/models/ and one line in FAMILIES. Its
`config.py` (no torch: the control plane reads it when a job is submitted) says which
`model_type`s it reads and how a config.json maps to the spec's model fields; its
`family.py` (torch: only the workers and the CLI's local commands load it, through
`workers.engine.models.family.load_family`) holds the `ModelFamily` the engine builds
from. Both are imported by name, on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, Protocol

# family name -> its package
FAMILIES: dict[str, str] = {
    "llama": "shardline.workers.engine.models.llama",
    "qwen2": "shardline.workers.engine.models.qwen2",
    "qwen3": "shardline.workers.engine.models.qwen3",
    "mistral": "shardline.workers.engine.models.mistral",
}


class FamilyConfig(Protocol):
    """A family's torch-free half: its name, the Hugging Face `model_type`s it reads, and
    config.json <-> the spec's model fields (`ModelSpec.resolved()`'s keys)."""

    @property
    def name(self) -> str: ...

    @property
    def model_types(self) -> tuple[str, ...]: ...

    @property
    def architecture(self) -> str:
        """transformers' class, written into an exported config.json."""
        ...

    @property
    def shape_keys(self) -> dict[str, str]:
        """config.json key -> the spec's model field it sets."""
        ...

    @property
    def fixed_args(self) -> dict[str, Any]:
        """Args every model of the family has, whatever its size (biases on q/k/v, q/k
        norms)."""
        ...

    def shape_from_hf(self, config: dict[str, Any]) -> dict[str, Any]:
        """The spec's model fields of a config.json; raises InitFromError for anything
        the family does not compute exactly as transformers does."""
        ...

    def hf_config(
        self, resolved: dict[str, Any], *, bos_token_id: int | None, eos_token_id: int | None
    ) -> dict[str, Any]:
        """A config.json that transformers loads with no custom code."""
        ...


def family_config(name: str) -> FamilyConfig:
    """The torch-free half of family `name`."""
    config: FamilyConfig = importlib.import_module(f"{package(name)}.config").CONFIG
    return config


def family_of_model_type(model_type: object) -> str | None:
    """The family that reads a config.json of this `model_type`, if any."""
    for name in FAMILIES:
        if model_type in family_config(name).model_types:
            return name
    return None


def model_types() -> list[str]:
    """Every `model_type` some family reads (for messages)."""
    return [t for name in FAMILIES for t in family_config(name).model_types]


class NamesFamily(Protocol):
    """A job's model spec (workers/contract/sections.py's ModelSpec, which imports this
    module: the registry names it by what it has)."""

    @property
    def family_name(self) -> str: ...


def family_of(model: NamesFamily) -> str:
    """The family a job's model belongs to: its own `family`, or its preset's."""
    return model.family_name


def package(name: str) -> str:
    """The package of family `name` (its `family.py` is loaded by
    workers/engine/models/family.py's `load_family`, with torch)."""
    if name not in FAMILIES:
        raise KeyError(f"no model family {name!r}; known: {', '.join(FAMILIES)}")
    return FAMILIES[name]
