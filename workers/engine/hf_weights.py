"""Hugging Face Llama weights <-> this engine's parameters.

Names: `model.layers.0.self_attn.q_proj.weight` is `layers.0.attention.wq.weight`, and so
on (table below). Rotary convention: this model rotates interleaved channel pairs
(model.apply_rope, as Meta's Llama code), Hugging Face rotates the two halves of each
head, so the rows of each q and k head are permuted on the way out and back on the way in
(the same permutation as transformers' convert_llama_weights_to_hf).

Import reads, on each rank, only the slices of the tensors that rank holds (safetensors'
lazy `get_slice`), straight into the local shards of the already-built model parts: plain
tensors, DTensors of tensor parallelism or FSDP, or pipeline stages (which keep the
original names).
"""

from __future__ import annotations

import json
import logging
import re
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

from workers.contract.data_access import DataAccess
from workers.contract.hf_config import CONFIG, SAFETENSORS_INDEX, shape_from_config
from workers.engine.model import ModelArgs

log = logging.getLogger(__name__)

_TOP = {
    "tok_embeddings.weight": "model.embed_tokens.weight",
    "norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attention.wq.weight": "self_attn.q_proj.weight",
    "attention.wk.weight": "self_attn.k_proj.weight",
    "attention.wv.weight": "self_attn.v_proj.weight",
    "attention.wo.weight": "self_attn.o_proj.weight",
    "feed_forward.w1.weight": "mlp.gate_proj.weight",
    "feed_forward.w3.weight": "mlp.up_proj.weight",
    "feed_forward.w2.weight": "mlp.down_proj.weight",
    "attention_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
}
_LAYER_BACK = {hf: own for own, hf in _LAYER.items()}
_OWN_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def to_hf_name(name: str) -> str:
    """`layers.3.attention.wq.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    if name in _TOP:
        return _TOP[name]
    match = _OWN_LAYER.match(name)
    if match is None or match.group(2) not in _LAYER:
        raise KeyError(f"no Hugging Face name for parameter {name}")
    return f"model.layers.{match.group(1)}.{_LAYER[match.group(2)]}"


def from_hf_name(hf_name: str) -> str:
    """The inverse of `to_hf_name`."""
    for own, hf in _TOP.items():
        if hf == hf_name:
            return own
    match = _HF_LAYER.match(hf_name)
    if match is None or match.group(2) not in _LAYER_BACK:
        raise KeyError(f"{hf_name} is not a Llama parameter this model has")
    return f"layers.{match.group(1)}.{_LAYER_BACK[match.group(2)]}"


def rope_heads(name: str, args: ModelArgs) -> int | None:
    """How many heads a q or k weight holds (its rows are permuted); None for the rest."""
    if name.endswith("attention.wq.weight"):
        return args.n_heads
    if name.endswith("attention.wk.weight"):
        return args.n_kv_heads
    return None


def interleaved_to_halves(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """q/k rows of this model -> Hugging Face's order, head by head."""
    rows, cols = w.shape
    return w.view(n_heads, rows // n_heads // 2, 2, cols).transpose(1, 2).reshape(rows, cols)


def halves_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Hugging Face q/k rows -> this model's order (the inverse of interleaved_to_halves)."""
    rows, cols = w.shape
    return w.view(n_heads, 2, rows // n_heads // 2, cols).transpose(1, 2).reshape(rows, cols)


def to_hf_state(state: dict[str, torch.Tensor], args: ModelArgs) -> dict[str, torch.Tensor]:
    """Whole tensors by this model's names -> Hugging Face names and rotary order."""
    out = {}
    for name, tensor in state.items():
        heads = rope_heads(name, args)
        value = interleaved_to_halves(tensor, heads) if heads else tensor
        out[to_hf_name(name)] = value.contiguous()
    return out


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


def _read_box(
    lazy: Any, shape: tuple[int, ...], offset: tuple[int, ...], heads: int | None, rows: int
) -> torch.Tensor:
    """Read global[offset : offset + shape] from a lazy safetensors slice, in this
    model's rotary order for q/k (whole heads are read, then cut)."""
    box = [slice(o, o + n) for o, n in zip(offset, shape, strict=True)]
    if heads is None:
        return lazy[tuple(box)]
    head_dim = rows // heads
    first, last = offset[0] // head_dim, -(-(offset[0] + shape[0]) // head_dim)
    whole = lazy[(slice(first * head_dim, last * head_dim), box[1])]
    ours = halves_to_interleaved(whole, last - first)
    start = offset[0] - first * head_dim
    return ours[start : start + shape[0]]


@torch.no_grad()
def load_init_from(modules: list[nn.Module], folder: Path, args: ModelArgs) -> None:
    """Fill this rank's shards of `modules` (its model parts, already built and
    parallelised) with the Hugging Face weights in `folder`."""
    access = DataAccess.from_env()
    with access.open(folder / CONFIG, "model.init_from") as handle:
        config = json.loads(handle.read().decode("utf-8"))
    shape = shape_from_config(config)
    for field, value in shape.items():
        if getattr(args, field) != value and field not in ("norm_eps", "rope_theta"):
            raise ValueError(
                f"model.init_from: {folder}/{CONFIG} has {field}={value} but the job's "
                f"model has {getattr(args, field)}; the folder changed after the job was "
                "submitted"
            )
    files = _weight_files(folder, access)
    tied = "lm_head.weight" not in files and bool(config.get("tie_word_embeddings", True))
    handles: dict[Path, Any] = {}
    loaded = 0
    with ExitStack() as stack:
        for module in modules:
            for name, value in get_model_state_dict(module).items():
                assert isinstance(value, torch.Tensor), name  # the model holds only tensors
                tensor = value
                hf_name = to_hf_name(name)
                if hf_name == "lm_head.weight" and tied:
                    hf_name = "model.embed_tokens.weight"
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
                values = _read_box(lazy, box_shape, offset, rope_heads(name, args), tensor.shape[0])
                local.copy_(values.to(local.dtype))
                loaded += values.numel()
    log.info("loaded %d weights of this rank's shards from %s", loaded, folder)
