"""Where the plain classes become Ray actors: the worker, and the supervisor wired to the
Ray worker group (which is handed the worker actor class, so nothing imports back here)."""

from __future__ import annotations

from typing import Any

import ray

from workers.contract.spec import JobSpec
from workers.runtime.supervisor import JobSupervisor
from workers.runtime.worker import TrainingWorker
from workers.runtime.worker_group import WorkerGroup
from workers.storage.layout import CheckpointLocations, JobLayout

__all__ = ["SupervisorActor", "WorkerActor"]

# A worker holds one rank; its resources come from its placement-group bundle.
WorkerActor = ray.remote(max_restarts=0)(TrainingWorker)


def ray_workers(spec: JobSpec, layout: JobLayout, locations: CheckpointLocations) -> WorkerGroup:
    """A job's ranks as Ray actors in one placement group."""
    return WorkerGroup(spec, layout, locations, worker_actor=WorkerActor)


class RayJobSupervisor(JobSupervisor):
    """The supervisor as the control plane starts it: its workers are Ray actors."""

    def __init__(self, layout: JobLayout, spec_json: str, **options: Any) -> None:
        super().__init__(layout, spec_json, make_workers=ray_workers, **options)


# The supervisor reserves nothing: the job's resources are all in its placement group.
SupervisorActor = ray.remote(num_cpus=0, max_restarts=0)(RayJobSupervisor)
