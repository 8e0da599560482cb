"""Building the model a rank trains: its pipeline stage(s), each parallelised from outside.

The order is torchtitan's: cut into pipeline stages, then tensor parallel, then activation
checkpointing, then data parallel / ZeRO, applied to each stage this rank holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh

from workers.engine.activation_checkpointing import apply_activation_checkpointing
from workers.engine.data_parallel import apply_data_parallel
from workers.engine.model import ModelArgs, Transformer, count_params, flops_per_token
from workers.engine.parallel import ParallelDims
from workers.engine.pipeline import split_model
from workers.engine.tensor_parallel import apply_tensor_parallel
from workers.spec import JobSpec

log = logging.getLogger(__name__)


@dataclass
class ModelParts:
    """The module(s) this rank trains: one, or one per pipeline stage it holds."""

    modules: list[nn.Module]
    stage_ids: list[int]
    num_stages: int
    flops_per_token: int

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
    spec: JobSpec, *, dims: ParallelDims, mesh: DeviceMesh, device: torch.device
) -> ModelParts:
    # Same seed on every rank: identical initial weights without a broadcast, and every
    # layout starts from the same model as one process would.
    torch.manual_seed(spec.train.seed)
    args = ModelArgs.from_resolved(spec.model.resolved())
    whole = Transformer(args)
    flops = flops_per_token(args, count_params(whole, exclude_embedding=True))
    virtual = spec.parallel.pp_virtual_stages
    if dims.pp > 1:
        pieces = split_model(
            whole, pp_rank=mesh["pp"].get_local_rank(), pp=dims.pp, virtual_stages=virtual
        )
        del whole
    else:
        pieces = [(0, whole)]
    modules = []
    for _, piece in pieces:
        piece.to(device)
        if dims.tp > 1:
            apply_tensor_parallel(
                piece, tp_mesh=mesh["tp"], sequence_parallel=spec.parallel.sequence_parallel
            )
        apply_activation_checkpointing(piece, mode=spec.train.activation_checkpointing)
        modules.append(
            apply_data_parallel(
                piece,
                dp_mesh=mesh["dp"],
                zero_stage=dims.effective_zero_stage,
                device=device,
                sync_after_backward=dims.syncs_grads_after_backward,
            )
        )
    num_stages = dims.pp * virtual if dims.pp > 1 else 1
    return ModelParts(modules, [s for s, _ in pieces], num_stages, flops)
