"""Pipeline parallelism with torch.distributed.pipelining.

The block stack is cut evenly into pp x virtual stages. A stage is the same module class
with the blocks (and the first or last stage's parts) it does not own removed
(`ModelFamily.cut_stage`), so its parameters keep their original names. Pipeline rank r
owns stages r, r + pp, r + 2pp, ... (one per virtual stage), which is what the
interleaved schedule expects.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.pipelining import PipelineStage
from torch.distributed.pipelining.schedules import (
    Schedule1F1B,
    ScheduleGPipe,
    ScheduleInterleaved1F1B,
    _PipelineSchedule,
)
from torch.distributed.pipelining.stage import _PipelineStageBase

from shardline.workers.contract.sections import PipelineSchedule
from shardline.workers.engine.models.family import ModelFamily

log = logging.getLogger(__name__)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def stage_ids(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    """The stages pipeline rank `pp_rank` runs, in order."""
    return [pp_rank + i * pp for i in range(virtual_stages)]


def split_model(
    model: nn.Module, family: ModelFamily, *, pp_rank: int, pp: int, virtual_stages: int
) -> list[tuple[int, nn.Module]]:
    """This rank's stages as (stage index, module), cut as the model's family cuts it."""
    num_stages = pp * virtual_stages
    parts = [
        (s, family.cut_stage(model, s, num_stages)) for s in stage_ids(pp_rank, pp, virtual_stages)
    ]
    log.info("pipeline rank %d holds stage(s) %s of %d", pp_rank, [s for s, _ in parts], num_stages)
    return parts


def build_schedule(
    parts: list[tuple[int, nn.Module]],
    *,
    pp_mesh: DeviceMesh,
    num_stages: int,
    n_microbatches: int,
    schedule: PipelineSchedule,
    loss_fn: LossFn,
    device: torch.device,
    wrap_chunk: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
) -> _PipelineSchedule:
    """The pipeline schedule over this rank's (already parallelised) stages.

    Every rank gets the loss function, or the schedule would run forward only on some.
    `wrap_chunk` wraps each stage's forward and backward of one micro-batch (the step
    clock times them there: the rest of the schedule's time is bubble).
    """
    stages: list[_PipelineStageBase] = [
        PipelineStage(module, index, num_stages, device, group=pp_mesh.get_group())
        for index, module in parts
    ]
    if wrap_chunk is not None:
        for stage in stages:
            stage.forward_one_chunk = wrap_chunk(stage.forward_one_chunk)  # type: ignore[method-assign]
            stage.backward_one_chunk = wrap_chunk(stage.backward_one_chunk)  # type: ignore[method-assign]
    if schedule == PipelineSchedule.interleaved_1f1b:
        return ScheduleInterleaved1F1B(stages, n_microbatches, loss_fn=loss_fn)
    cls = ScheduleGPipe if schedule == PipelineSchedule.gpipe else Schedule1F1B
    return cls(stages[0], n_microbatches, loss_fn=loss_fn)
