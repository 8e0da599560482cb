"""Data parallelism and ZeRO sharding, applied to a model from outside.

zero 0: DDP (gradients all-reduced, everything replicated).
zero 1: DDP (or an all-reduce after backward) + optimizer state sliced across dp
        (workers/engine/zero_one.py).
zero 2: FSDP2 with reshard_after_forward=False, PyTorch's ZeRO-2 (SHARD_GRAD_OP):
        gradients and optimizer state sharded; parameters are gathered once per step and
        held whole through forward and backward, sharded between steps.
zero 3: FSDP2 fully_shard: parameters sharded too, gathered per block in forward and again
        in backward.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from shardline.workers.engine.precision import local_grads

log = logging.getLogger(__name__)


def syncs_grads_after_backward(*, dp: int, zero_stage: int, pp: int, tp: int) -> bool:
    """Whether replicated gradients are all-reduced by `all_reduce_grads` after backward
    instead of by DDP during it. DDP's reducer cannot follow a pipeline schedule's
    interleaved micro-batches, and does not take DTensor (tensor-parallel) parameters."""
    return dp > 1 and zero_stage <= 1 and (pp > 1 or tp > 1)


def all_reduce_grads(
    params: Iterable[nn.Parameter], dp_mesh: DeviceMesh, dtype: torch.dtype | None = None
) -> None:
    """Average this rank's gradients over data-parallel ranks, in one flat collective
    (sent as `dtype` if given: bf16 halves the bytes)."""
    grads = local_grads(params)
    if not grads:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    sent = flat if dtype is None else flat.to(dtype)
    dist.all_reduce(sent, group=dp_mesh.get_group())
    if sent is not flat:
        flat.copy_(sent)
    flat /= dp_mesh.size()
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def apply_data_parallel(
    model: nn.Module,
    *,
    dp_mesh: DeviceMesh,
    zero_stage: int,
    device: torch.device,
    sync_after_backward: bool = False,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = None,
) -> nn.Module:
    """Wrap or shard `model` over `dp_mesh`; returns the module to call for training.

    With `sync_after_backward` (see `syncs_grads_after_backward`) replicated stages are
    left unwrapped and the caller all-reduces their gradients. `param_dtype` (zero 2/3
    only) is the dtype FSDP gathers parameters in; gradients are still reduced in fp32
    unless `reduce_dtype` (the job's bf16 grad_compression) says otherwise.
    """
    dp = dp_mesh.size()
    if dp == 1:
        return model
    if zero_stage <= 1 and sync_after_backward:
        log.info(
            "data parallel over dp=%d (zero-%d): gradients all-reduced after backward",
            dp,
            zero_stage,
        )
        return model
    if zero_stage <= 1:
        wrapped = DistributedDataParallel(
            model,
            process_group=dp_mesh.get_group(),
            device_ids=[device.index] if device.type == "cuda" else None,
            gradient_as_bucket_view=True,
        )
        log.info("applied DDP over dp=%d (zero-%d)", dp, zero_stage)
        return wrapped
    reshard = zero_stage == 3
    # reduce_dtype fp32: low-precision gathers halve the bytes, but summing gradients
    # over ranks in bf16 would lose the small ones.
    mp_policy = MixedPrecisionPolicy(
        param_dtype=param_dtype,
        reduce_dtype=reduce_dtype or (torch.float32 if param_dtype else None),
    )
    layers = getattr(model, "layers", None)
    blocks: Iterable[nn.Module] = layers.values() if isinstance(layers, nn.ModuleDict) else ()
    for block in blocks:
        fully_shard(block, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp_policy)
    # The root holds embeddings, final norm and output head; FSDP2 keeps the root's
    # parameters gathered between forward and backward anyway.
    fully_shard(model, mesh=dp_mesh, reshard_after_forward=reshard, mp_policy=mp_policy)
    log.info(
        "applied FSDP2 (zero-%d) over dp=%d%s",
        zero_stage,
        dp,
        f", gathering {param_dtype} parameters" if param_dtype else "",
    )
    if reduce_dtype is not None:
        log.info("FSDP reduce-scatters gradients in %s", reduce_dtype)
    return model
