"""Building the model a rank trains: its pipeline stage(s), each parallelised from outside.

The order is torchtitan's: build on the meta device, cut into pipeline stages, then tensor
parallel, then activation checkpointing, then torch.compile per block, then data parallel /
ZeRO, applied to each stage this rank holds; weights are allocated and drawn last, for this
rank's shards only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from shardline.workers.contract.grad_compression import GradCompressionKind
from shardline.workers.contract.sections import Precision
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.activation_checkpointing import apply_activation_checkpointing
from shardline.workers.engine.compiling import apply_compile
from shardline.workers.engine.data_parallel import apply_data_parallel
from shardline.workers.engine.initialise import materialise, parameter_source
from shardline.workers.engine.models.family import ModelFamily
from shardline.workers.engine.parallel import ParallelDims
from shardline.workers.engine.pipeline import split_model

log = logging.getLogger(__name__)


@dataclass
class ModelParts:
    """The module(s) this rank trains: one, or one per pipeline stage it holds."""

    modules: list[nn.Module]
    stage_ids: list[int]
    num_stages: int
    flops_per_token: int
    family: ModelFamily
    args: Any  # the family's args

    @property
    def has_first_stage(self) -> bool:
        return 0 in self.stage_ids

    @property
    def has_last_stage(self) -> bool:
        return self.num_stages - 1 in self.stage_ids

    def parameters(self) -> list[nn.Parameter]:
        return [p for m in self.modules for p in m.parameters()]

    def train(self, mode: bool = True) -> None:
        for m in self.modules:
            m.train(mode)


def build_model_parts(
    spec: JobSpec,
    family: ModelFamily,
    *,
    dims: ParallelDims,
    mesh: DeviceMesh,
    device: torch.device,
    data_parallel: bool = True,
) -> ModelParts:
    """This rank's part of `family`'s model, parallelised, with its initial weights.

    The model is built on the meta device (no storage), cut and sharded there, and only
    then are this rank's shards allocated and filled, so no rank ever holds it whole.
    Without `data_parallel` nothing wraps the model for data parallelism (a strategy
    whose replicas exchange what they trained themselves).
    """
    # Weights come from per-parameter generators (initialise.py); the global seed still
    # fixes anything else drawn while building.
    torch.manual_seed(spec.train.seed)
    args = family.args(spec.model.resolved())
    with torch.device("meta"):
        whole = family.build(args)
    flops = family.flops_per_token(args, whole)
    source = parameter_source(spec, family, args)
    virtual = spec.parallel.pp_virtual_stages
    if dims.pp > 1:
        pieces = split_model(
            whole,
            family,
            pp_rank=mesh["pp"].get_local_rank(),
            pp=dims.pp,
            virtual_stages=virtual,
        )
        del whole
    else:
        pieces = [(0, whole)]
    zero = dims.effective_zero_stage
    # FSDP shards meta parameters, so they are materialised after it (only the shards);
    # DDP needs real ones to wrap, and replicates them anyway.
    sharded = dims.dp > 1 and zero >= 2
    modules = []
    for _, piece in pieces:
        if dims.tp > 1:
            family.parallelize(
                piece, tp_mesh=mesh["tp"], sequence_parallel=spec.parallel.sequence_parallel
            )
        apply_activation_checkpointing(piece, mode=spec.train.activation_checkpointing)
        if spec.train.compile:
            apply_compile(piece)
        if not sharded:
            materialise(piece, source=source, device=device)
        module = (
            piece
            if not data_parallel
            else apply_data_parallel(
                piece,
                dp_mesh=mesh["dp"],
                zero_stage=zero,
                device=device,
                sync_after_backward=dims.syncs_grads_after_backward,
                param_dtype=fsdp_param_dtype(spec),
                reduce_dtype=grad_reduce_dtype(spec),
            )
        )
        if sharded:
            materialise(piece, source=source, device=device)
        modules.append(module)
    num_stages = dims.pp * virtual if dims.pp > 1 else 1
    return ModelParts(modules, [s for s, _ in pieces], num_stages, flops, family, args)


def grad_reduce_dtype(spec: JobSpec) -> torch.dtype | None:
    """bf16 where the job compresses gradients to bf16; else each path's own default."""
    if spec.parallel.grad_compression.kind == GradCompressionKind.bf16:
        return torch.bfloat16
    return None


def fsdp_param_dtype(spec: JobSpec) -> torch.dtype | None:
    """bf16 for FSDP's gathered parameters in a bf16 job (half the all-gather bytes; the
    shards, gradients and their reduction stay fp32), unless the spec turns it off."""
    if spec.precision == Precision.bf16 and spec.parallel.fsdp_mixed_precision:
        return torch.bfloat16
    return None
