"""How a job's Ray actors and placement group are named (found again by these names)."""

from __future__ import annotations

NAMESPACE = "shardline"


def supervisor_name(job_id: str) -> str:
    return f"shardline-job-{job_id}"


def placement_group_name(job_id: str) -> str:
    return f"shardline-job-{job_id}"


def worker_name(job_id: str, attempt: int, rank: int) -> str:
    return f"shardline-job-{job_id}-a{attempt}-rank-{rank}"
