"""Where the plain classes become Ray actors: the worker, the warm pool and its workers,
and the supervisor wired to the Ray worker group (which is handed the worker actor class,
so nothing imports back here)."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime import priority
from shardline.workers.runtime.group_callbacks import PoolLending, SnapshotCleanup, SpareMaking
from shardline.workers.runtime.pooled_worker import PooledWorker
from shardline.workers.runtime.supervisor import JobSupervisor
from shardline.workers.runtime.warm_pool import Idle, WarmPool
from shardline.workers.runtime.worker import TrainingWorker
from shardline.workers.runtime.worker_group import WorkerGroup
from shardline.workers.storage.layout import CheckpointLocations, JobLayout

__all__ = ["SupervisorActor", "WarmPoolActor", "WorkerActor"]

# A worker holds one rank; its resources come from its placement-group bundle.
WorkerActor = ray.remote(max_restarts=0)(TrainingWorker)
# A pooled worker reserves nothing: the job that adopts it reserves its rank's bundle.
PooledWorkerActor = ray.remote(num_cpus=0, max_restarts=0)(PooledWorker)


def ray_workers(spec: JobSpec, layout: JobLayout, locations: CheckpointLocations) -> WorkerGroup:
    """A job's ranks as Ray actors in one placement group."""
    callbacks = [SpareMaking(), PoolLending(), SnapshotCleanup()]
    return WorkerGroup(spec, layout, locations, worker_actor=WorkerActor, callbacks=callbacks)


class RayJobSupervisor(JobSupervisor):
    """The supervisor as the control plane starts it: its workers are Ray actors."""

    def __init__(self, layout: JobLayout, spec: JobSpec, **options: Any) -> None:
        # Out of Ray's nice 15, where warm processes starting beside it held back the
        # relay of the job's steps (and its recovery) by seconds on busy cores.
        priority.normal()
        super().__init__(layout, spec, make_workers=ray_workers, **options)


# The supervisor reserves nothing: the job's resources are all in its placement group.
SupervisorActor = ray.remote(num_cpus=0, max_restarts=0)(RayJobSupervisor)


class RayWarmPool(WarmPool):
    """The warm pool with its workers as Ray actors, each pinned to its node."""

    def _start(self, node: str) -> Idle:
        actor: Any = PooledWorkerActor.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote()
        return Idle(node, actor, actor.__ray_ready__.remote())


# Its calls are quick; its upkeep runs on a thread of its own.
WarmPoolActor = ray.remote(num_cpus=0, max_restarts=0)(RayWarmPool)
