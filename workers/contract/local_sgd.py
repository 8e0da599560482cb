"""`parallel.dp_mode` and `parallel.local_sgd`: how data-parallel replicas agree.

`sync` (the default) averages every step's gradients over the replicas. `local_sgd` is
DiLoCo (Douillard et al. 2023): each replica takes `sync_every` steps on its own with the
job's optimizer (AdamW, the "inner" one), then the replicas average how far their
parameters moved since the last sync (the "delta", optionally sent in bf16) and an outer
Nesterov SGD (`outer_lr`, `outer_momentum`) steps the shared parameters by it. A sync
sends one model's worth of bytes per `sync_every` steps instead of one per step.
`async` (workers/engine/async_dp.py) has no replica wait for another between rounds of
`train.log_every` steps: each pushes its gradient to parameter-server shards and pulls the
parameters back; a gradient more than `parallel.max_staleness` updates old is dropped or
down-weighted (`parallel.staleness_policy`).

What it does not take is refused here, each with the fix: only data parallelism at
zero_stage 0 (ZeRO would shard a state each replica must hold whole; tensor and pipeline
parallelism inside a replica are not built), no gradient compression (there are no
per-step gradients to compress), not `auto`, not fp16, not elastic; and checkpoints and
snapshots only where the replicas agree, at a sync (workers/contract/spec.py checks these).
Pure pydantic: no torch.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

from pydantic import Field

from shardline.workers.contract.strict import _Strict


class DataParallelMode(StrEnum):
    sync = "sync"
    local_sgd = "local_sgd"
    asynchronous = "async"


class StalenessPolicy(StrEnum):
    """What `async` does with a gradient more than `parallel.max_staleness` updates old."""

    drop = "drop"  # not applied (counted)
    weight = "weight"  # applied, scaled by (1 + max_staleness) / (1 + staleness)


class DeltaDtype(StrEnum):
    fp32 = "fp32"
    bf16 = "bf16"


class LocalSgd(_Strict):
    # Inner steps between syncs: the bytes sent per step fall by this factor.
    sync_every: Annotated[int, Field(ge=2, le=100_000)] = 16
    # DiLoCo's outer optimizer: Nesterov SGD on the averaged delta, as in the paper.
    outer_lr: Annotated[float, Field(gt=0.0, le=10.0)] = 0.7
    outer_momentum: Annotated[float, Field(ge=0.0, lt=1.0)] = 0.9
    # bf16 halves the bytes of a sync; the shared parameters and the momentum stay fp32.
    delta_dtype: DeltaDtype = DeltaDtype.fp32


def is_sync_step(step: int, *, sync_every: int, total_steps: int) -> bool:
    """Whether the replicas sync after `step`: every `sync_every` steps, and after the
    last, so a run always ends on the replicas' shared parameters."""
    return step % sync_every == 0 or step == total_steps
