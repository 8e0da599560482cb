"""Bytes of model state a rank holds, predicted from the spec alone (no torch).

What the engine builds, parameter by parameter: the Llama-like shapes of
`ModelSpec.resolved()` (with the family's q/k/v biases and q/k norms, and one tensor for
tied embeddings),
cut into pipeline stages (contiguous layers; the embedding on the first stage, the final
norm and head on the last), sharded by tensor parallelism (colwise linears and the
embedding on their first dimension, rowwise linears on their second, norms whole), then by
data parallelism as the ZeRO stage says:
- zero 0: parameters, gradients and optimizer state whole on every dp rank;
- zero 1: parameters and gradients whole, optimizer state sliced over dp along the first
  dimension tensor parallelism leaves whole (workers/engine/zero_one.py);
- zero 2/3: FSDP2 cuts dimension 0 of every (tensor-parallel) local part over dp.
Every cut follows torch.chunk: ceil-sized pieces, the last ranks holding less or nothing.
Parameters, gradients and AdamW's two moments are fp32; AdamW adds a 4-byte step counter
per parameter it updates.

`model_state_bytes` gives the most any rank holds of each kind, as the engine's logged
`mem_bytes` reports it (each kind's maximum over ranks).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Any

from shardline.workers.contract.local_sgd import DataParallelMode
from shardline.workers.contract.sections import ParallelSpec

FP32 = 4
ADAM_MOMENTS = 2
STEP_COUNTER_BYTES = 4
KINDS = ("params", "grads", "optim")


@dataclass(frozen=True)
class ParamShape:
    """One parameter: its full shape, the dimension tensor parallelism cuts (None: whole)
    and where it lives: layer index, or "first" / "last" for the pipeline's ends."""

    name: str
    shape: tuple[int, ...]
    tp_dim: int | None
    where: int | str


def parameter_shapes(resolved: dict[str, Any]) -> list[ParamShape]:
    """Every parameter of the model, as `ModelSpec.resolved()` describes it."""
    dim, vocab, ffn = resolved["dim"], resolved["vocab_size"], resolved["ffn_dim"]
    head_dim = resolved.get("head_dim") or dim // resolved["n_heads"]
    q_dim, kv_dim = resolved["n_heads"] * head_dim, resolved["n_kv_heads"] * head_dim
    shapes = [ParamShape("tok_embeddings.weight", (vocab, dim), 0, "first")]
    for i in range(resolved["n_layers"]):
        p = f"layers.{i}."
        shapes += [
            ParamShape(p + "attention_norm.weight", (dim,), None, i),
            ParamShape(p + "attention.wq.weight", (q_dim, dim), 0, i),
            ParamShape(p + "attention.wk.weight", (kv_dim, dim), 0, i),
            ParamShape(p + "attention.wv.weight", (kv_dim, dim), 0, i),
            ParamShape(p + "attention.wo.weight", (dim, q_dim), 1, i),
            ParamShape(p + "ffn_norm.weight", (dim,), None, i),
            ParamShape(p + "feed_forward.w1.weight", (ffn, dim), 0, i),
            ParamShape(p + "feed_forward.w3.weight", (ffn, dim), 0, i),
            ParamShape(p + "feed_forward.w2.weight", (dim, ffn), 1, i),
        ]
        if resolved.get("qkv_bias"):
            shapes += [
                ParamShape(p + "attention.wq.bias", (q_dim,), 0, i),
                ParamShape(p + "attention.wk.bias", (kv_dim,), 0, i),
                ParamShape(p + "attention.wv.bias", (kv_dim,), 0, i),
            ]
        if resolved.get("qk_norm"):
            shapes += [
                ParamShape(p + "attention.q_norm.weight", (head_dim,), None, i),
                ParamShape(p + "attention.k_norm.weight", (head_dim,), None, i),
            ]
    shapes.append(ParamShape("norm.weight", (dim,), None, "last"))
    if not resolved.get("tie_embeddings"):
        shapes.append(ParamShape("output.weight", (vocab, dim), 0, "last"))
    return shapes


# The fields of `ModelSpec.resolved()` one layer's and the ends' shapes depend on.
SHAPE_FIELDS = (
    "dim",
    "n_heads",
    "n_kv_heads",
    "vocab_size",
    "ffn_dim",
    "head_dim",
    "qkv_bias",
    "qk_norm",
    "tie_embeddings",
)


@functools.lru_cache(maxsize=64)
def _one_layer_and_ends(dims: tuple[Any, ...]) -> tuple[ParamShape, ...]:
    """The ends and layer 0 (every layer has its shapes): a planner asks thousands of
    times for one model."""
    shapes = parameter_shapes({**dict(zip(SHAPE_FIELDS, dims, strict=True)), "n_layers": 1})
    return tuple(shapes)


def chunk_length(size: int, parts: int, index: int) -> int:
    """Length of piece `index` of `size` cut into `parts`, as torch.chunk and DTensor cut."""
    full = math.ceil(size / parts)
    start = min(full * index, size)
    return min(size, start + full) - start


def _numel(shape: tuple[int, ...] | list[int]) -> int:
    return math.prod(shape)


def _tensor_state(p: ParamShape, parallel: ParallelSpec) -> tuple[int, int]:
    """(parameter elements, optimizer-moment elements) of `p` on dp rank 0 and tp rank 0,
    which hold the longest piece of every cut, so the most of every kind."""
    dp, zero = parallel.dp, parallel.zero_stage if parallel.dp > 1 else 0
    local = list(p.shape)
    if p.tp_dim is not None and parallel.tp > 1:
        local[p.tp_dim] = chunk_length(local[p.tp_dim], parallel.tp, 0)
    if zero >= 2:
        local[0] = chunk_length(local[0], dp, 0)
    held = _numel(local)
    if zero != 1:
        return held, held
    # ZeRO-1 slices the first dimension tensor parallelism leaves whole.
    cut = next((d for d in range(len(local)) if d != p.tp_dim or parallel.tp == 1), 0)
    sliced = list(local)
    sliced[cut] = chunk_length(local[cut], dp, 0)
    return held, _numel(sliced)


def _bytes_of(tensors: list[tuple[int, int]]) -> dict[str, int]:
    params = sum(t[0] for t in tensors)
    moments = sum(t[1] for t in tensors)
    return {
        "params": params * FP32,
        "grads": params * FP32,
        "optim": moments * ADAM_MOMENTS * FP32 + len(tensors) * STEP_COUNTER_BYTES,
    }


def model_state_bytes(resolved: dict[str, Any], parallel: ParallelSpec) -> dict[str, int]:
    """The most any rank holds of each kind (the engine's `mem_bytes`).

    Every pipeline rank holds as many layers (n_layers / pp); the first also holds the
    embedding and the last the final norm and head, so those two bound the rest.
    """
    if parallel.pp > 1:
        # A tied head on the last stage is a copy of the first stage's embedding.
        resolved = {**resolved, "tie_embeddings": False}
    shapes = _one_layer_and_ends(tuple(resolved.get(k) for k in SHAPE_FIELDS))
    layer = [_tensor_state(p, parallel) for p in shapes if p.where == 0]
    first = [_tensor_state(p, parallel) for p in shapes if p.where == "first"]
    last = [_tensor_state(p, parallel) for p in shapes if p.where == "last"]
    layers = layer * (resolved["n_layers"] // parallel.pp)
    if parallel.pp == 1:
        held = _bytes_of(first + layers + last)
        if parallel.dp_mode == DataParallelMode.local_sgd:
            # DiLoCo's anchors and outer momentum: two more fp32 copies of the parameters
            # (local SGD runs without pp, tp or ZeRO, so every rank holds them whole).
            held["optim"] += 2 * held["params"]
        if parallel.dp_mode == DataParallelMode.asynchronous:
            # The shard a rank serves (about 1/dp of the parameters): its fp32 masters and
            # AdamW's two moments; the replica's own optimizer never steps.
            held["optim"] = -(-3 * held["params"] // parallel.dp)
        return held
    ends = [_bytes_of(first + layers), _bytes_of(layers + last)]
    return {kind: max(end[kind] for end in ends) for kind in KINDS}
