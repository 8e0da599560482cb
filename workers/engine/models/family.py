"""What a model family gives the engine (torchtitan's TrainSpec and StateDictAdapter are
the models): its args, its module, how tensor parallelism splits it, how pipeline stages
cut it, how it is initialised, and its Hugging Face adapters in both directions.

The trainer never asks which family it runs. What the engine assumes of every family's
module (`FamilyModule`): its repeated blocks live in `layers`, an `nn.ModuleDict` keyed by
their index (activation checkpointing, compile and FSDP apply per block; a pipeline stage
keeps a contiguous run of them), every other top-level part may be set to None (a stage
without it), and non-persistent buffers are computed again by `reset_buffers()` after a
meta-device build is given storage.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardline.workers.engine.models.registry import FamilyConfig, package


class FamilyModule(Protocol):
    layers: nn.ModuleDict

    def reset_buffers(self) -> None:
        """Compute non-persistent buffers again and restore shared parameters (tied
        embeddings), after `to_empty` gave the module storage."""
        ...


class StateDictAdapter(Protocol):
    """This model's parameters <-> a Hugging Face checkpoint's tensors, for one shape."""

    # A Hugging Face name that a checkpoint with tied embeddings leaves out -> the one it
    # reads instead.
    tied: dict[str, str]
    # This model's names that are not written out (a tied head: the embedding stands for it).
    not_written: frozenset[str]

    def to_hf_name(self, name: str) -> str: ...

    def from_hf_name(self, hf_name: str) -> str: ...

    def to_hf(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A whole tensor of this model in Hugging Face's layout."""
        ...

    def read_hf(
        self, name: str, lazy: Any, shape: tuple[int, ...], offset: tuple[int, ...]
    ) -> torch.Tensor:
        """The box `[offset : offset + shape]` of this model's tensor `name`, read from the
        lazy safetensors slice of its Hugging Face tensor (only what the box needs)."""
        ...


class TensorParallelPlan(Protocol):
    def __call__(self, model: nn.Module, *, tp_mesh: DeviceMesh, sequence_parallel: bool) -> None:
        """Shard `model` (whole, or a pipeline stage) over `tp_mesh` in place."""
        ...


class Decoder(Protocol):
    """Logits of new positions, keeping what earlier positions computed (a KV cache)."""

    def __call__(self, tokens: torch.Tensor, start: int) -> torch.Tensor: ...


@dataclass(frozen=True)
class ModelFamily:
    config: FamilyConfig
    # ModelSpec.resolved() -> the family's args.
    args: Callable[[dict[str, Any]], Any]
    # args -> the whole module (built under torch.device("meta") by the engine).
    build: Callable[[Any], nn.Module]
    parallelize: TensorParallelPlan
    # Top-level parts only the first stage holds, and only the last.
    first_stage_parts: tuple[str, ...]
    last_stage_parts: tuple[str, ...]
    # (parameter name, args) -> std of its random draw, None for ones.
    init_std: Callable[[str, Any], float | None]
    # (args, the whole module) -> training FLOPs per token.
    flops_per_token: Callable[[Any, nn.Module], int]
    state_dict_adapter: Callable[[Any], StateDictAdapter]
    # (whole module, most positions) -> a decoder for `shardline generate`.
    decoder: Callable[[nn.Module, int], Decoder]
    # args -> {a parameter's name: the name of the one it is} (a tied head); a pipeline
    # holds each apart on its own stage (workers/engine/tied.py).
    tied_parameters: Callable[[Any], dict[str, str]] = lambda args: {}

    @property
    def name(self) -> str:
        return self.config.name

    def cut_stage(self, model: nn.Module, stage: int, num_stages: int) -> nn.Module:
        """A copy of `model` holding only stage `stage`'s blocks, and the top-level parts
        of the first or last stage where it is one."""
        part: Any = copy.deepcopy(model)
        layers = part.layers
        assert isinstance(layers, nn.ModuleDict)
        per_stage = len(layers) // num_stages
        keep = {str(i) for i in range(stage * per_stage, (stage + 1) * per_stage)}
        for name in list(layers.keys()):
            if name not in keep:
                del layers[name]
        if stage != 0:
            for name in self.first_stage_parts:
                setattr(part, name, None)
        if stage != num_stages - 1:
            for name in self.last_stage_parts:
                setattr(part, name, None)
        return part


def count_params(model: nn.Module, exclude_embedding: bool = False) -> int:
    """Number of parameters; optionally without the token embedding (a lookup, not a matmul)."""
    total = sum(p.numel() for p in model.parameters())
    if exclude_embedding:
        total -= sum(
            p.numel()
            for m in model.modules()
            if isinstance(m, nn.Embedding)
            for p in m.parameters()
        )
    return total


def load_family(name: str) -> ModelFamily:
    """Model family `name` (workers/engine/models/registry.py), imported on first use."""
    family: ModelFamily = importlib.import_module(f"{package(name)}.family").FAMILY
    return family
