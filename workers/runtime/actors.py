"""Where the plain classes become Ray actors, and how they are named."""

from __future__ import annotations

import ray

from workers.runtime.supervisor.machine import JobSupervisor
from workers.runtime.worker import TrainingWorker

NAMESPACE = "shardline"

# A worker holds one rank; its resources come from its placement-group bundle.
WorkerActor = ray.remote(max_restarts=0)(TrainingWorker)
# The supervisor reserves nothing: the job's resources are all in its placement group.
SupervisorActor = ray.remote(num_cpus=0, max_restarts=0)(JobSupervisor)


def supervisor_name(job_id: str) -> str:
    return f"shardline-job-{job_id}"


def worker_name(job_id: str, attempt: int, rank: int) -> str:
    return f"shardline-job-{job_id}-a{attempt}-rank-{rank}"
