"""Hugging Face weights <-> this engine's parameters, through the model family's
`StateDictAdapter` (names, and any change of layout such as Llama's rotary order).

Import reads, on each rank, only the slices of the tensors that rank holds (safetensors'
lazy `get_slice`), straight into the local shards of the already-built model parts: plain
tensors, DTensors of tensor parallelism or FSDP, or pipeline stages (which keep the
original names).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.hf_config import CONFIG, SAFETENSORS_INDEX
from shardline.workers.engine.models.family import ModelFamily, StateDictAdapter
from shardline.workers.engine.models.registry import family_of_model_type

log = logging.getLogger(__name__)


def to_hf_state(
    state: dict[str, torch.Tensor], adapter: StateDictAdapter
) -> dict[str, torch.Tensor]:
    """Whole tensors by this model's names -> Hugging Face names and layout."""
    return {
        adapter.to_hf_name(name): adapter.to_hf(name, t).contiguous()
        for name, t in state.items()
        if name not in adapter.not_written
    }


# The fields whose change after submit would make the weights not fit (the others, such as
# rope_theta, change what the model computes, not what it holds).
SHAPE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "ffn_dim", "head_dim")


# -- import: fill each rank's shards from the safetensors files ----------------------------


def _weight_files(folder: Path, access: DataAccess) -> dict[str, Path]:
    """Hugging Face tensor name -> the safetensors file that holds it."""
    index = folder / SAFETENSORS_INDEX
    if index.is_file():
        with access.open(index, "model.init_from") as handle:
            weight_map = json.loads(handle.read().decode("utf-8"))["weight_map"]
        return {name: folder / file for name, file in weight_map.items()}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"model.init_from: {folder} holds no *.safetensors weights")
    found: dict[str, Path] = {}
    for path in files:
        with _checked(path, access) as checked, safe_open(checked, framework="pt") as handle:
            found.update(dict.fromkeys(handle.keys(), path))
    return found


@contextmanager
def _checked(path: Path, access: DataAccess) -> Iterator[str]:
    """A file name for `path` that names exactly the file `access` checked: on Linux the
    open descriptor's /proc path, so a symlink swapped in after the check changes nothing."""
    with access.open(path, "model.init_from") as handle:
        fd_path = f"/proc/self/fd/{handle.fileno()}"
        yield fd_path if Path(fd_path).exists() else str(path)


def _local_box(tensor: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], tuple[int, ...]]:
    """(local tensor, its shape, its offset in the global tensor)."""
    if isinstance(tensor, DTensor):
        shape, offset = compute_local_shape_and_global_offset(
            tensor.shape, tensor.device_mesh, tensor.placements
        )
        return tensor.to_local(), tuple(shape), tuple(offset)
    return tensor, tuple(tensor.shape), (0,) * tensor.dim()


@torch.no_grad()
def load_init_from(modules: list[nn.Module], folder: Path, family: ModelFamily, args: Any) -> None:
    """Fill this rank's shards of `modules` (its model parts of `family`, with `args`,
    already built and parallelised) with the Hugging Face weights in `folder`."""
    access = DataAccess.from_env()
    with access.open(folder / CONFIG, "model.init_from") as handle:
        config = json.loads(handle.read().decode("utf-8"))
    if family_of_model_type(config.get("model_type")) != family.name:
        raise ValueError(
            f"model.init_from: {folder}/{CONFIG} has model_type={config.get('model_type')!r}, "
            f"not one of the {family.name} family the job builds; the folder changed after "
            "the job was submitted"
        )
    shape = family.config.shape_from_hf(config)
    adapter = family.state_dict_adapter(args)
    for field, value in shape.items():
        if getattr(args, field) != value and field in SHAPE_FIELDS:
            raise ValueError(
                f"model.init_from: {folder}/{CONFIG} has {field}={value} but the job's "
                f"model has {getattr(args, field)}; the folder changed after the job was "
                "submitted"
            )
    files = _weight_files(folder, access)
    tie = bool(config.get("tie_word_embeddings", True))
    handles: dict[Path, Any] = {}
    loaded = 0
    with ExitStack() as stack:
        for module in modules:
            for name, value in get_model_state_dict(module).items():
                assert isinstance(value, torch.Tensor), name  # the model holds only tensors
                tensor = value
                hf_name = adapter.to_hf_name(name)
                if hf_name not in files and tie and hf_name in adapter.tied:
                    hf_name = adapter.tied[hf_name]
                if hf_name not in files:
                    raise ValueError(f"model.init_from: {folder} has no tensor {hf_name}")
                path = files[hf_name]
                if path not in handles:
                    checked = stack.enter_context(_checked(path, access))
                    handles[path] = stack.enter_context(safe_open(checked, framework="pt"))
                lazy = handles[path].get_slice(hf_name)
                if tuple(lazy.get_shape()) != tuple(tensor.shape):
                    raise ValueError(
                        f"model.init_from: {hf_name} has shape {tuple(lazy.get_shape())}, "
                        f"the model needs {tuple(tensor.shape)}"
                    )
                local, box_shape, offset = _local_box(tensor)
                values = adapter.read_hf(name, lazy, box_shape, offset)
                local.copy_(values.to(local.dtype))
                loaded += values.numel()
    log.info("loaded %d weights of this rank's shards from %s", loaded, folder)
