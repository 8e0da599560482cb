"""Giving a model built on the meta device its weights: each rank fills only what it holds.

A parameter's full value depends on (seed, its model name) alone: it is drawn from a
generator seeded by both, one parameter at a time, and the rank keeps its slice (DTensor
placements say which). So every layout, however it is cut into pipeline stages and sharded
over tp and dp, starts from exactly the weights one process would, and a rank never holds
more than its shards plus the one parameter being drawn.

`parameter_source` is the one place that decides where initial weights come from; a
loader for `model.init_from` returns its own `ParameterSource` there.
"""

from __future__ import annotations

import logging
from typing import Any, cast

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.models.family import FamilyModule, ModelFamily
from shardline.workers.engine.optimizer import model_name
from shardline.workers.engine.random_init import ParameterSource, random_parameters

log = logging.getLogger(__name__)


def parameter_source(spec: JobSpec, family: ModelFamily, args: Any) -> ParameterSource:
    """Where this job's initial weights come from: random, as the family draws them
    (`model.init_from` then loads its weights over this rank's shards). A tied
    parameter's copy on another pipeline stage is drawn as the one it is."""
    draw = random_parameters(
        seed=spec.train.seed, init_std=lambda name: family.init_std(name, args)
    )
    ties = family.tied_parameters(args)
    if not ties:
        return draw
    return lambda name, shape, device: draw(ties.get(name, name), shape, device)


@torch.no_grad()
def fill_parameter(param: torch.Tensor, full: torch.Tensor) -> None:
    """Copy this rank's part of `full` into `param` (plain, or a DTensor shard)."""
    if isinstance(param, DTensor):
        # src_data_rank=None: every rank cuts its own slice from its own copy, no
        # communication; the placements (FSDP's and tp's, strided or not) say where.
        mine = distribute_tensor(
            full, param.device_mesh, param.placements, src_data_rank=None
        ).to_local()
        param.to_local().copy_(mine)
    else:
        param.copy_(full)


@torch.no_grad()
def materialise(module: nn.Module, *, source: ParameterSource, device: torch.device) -> None:
    """Allocate `module`'s (meta) parameters on `device` and fill them from `source`."""
    module.to_empty(device=device)
    cast(FamilyModule, module).reset_buffers()
    count = 0
    for name, param in module.named_parameters():
        full = source(model_name(name), param.shape, device)
        if full.shape != param.shape:
            raise ValueError(
                f"initial value of {model_name(name)} has shape {tuple(full.shape)}, "
                f"the model's is {tuple(param.shape)}"
            )
        fill_parameter(param, full.to(param.dtype))
        del full  # at most one full parameter alive at a time
        count += 1
    log.info("materialised %d parameters on %s", count, device)
