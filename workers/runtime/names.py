"""How a job's Ray actors and placement group are named (found again by these names)."""

from __future__ import annotations

NAMESPACE = "shardline"
# Ray gives this resource to the head node only: what the control plane's actors ask for.
HEAD_RESOURCE = "node:__internal_head__"
# A node label (`ray start --labels shardline.io/cores=N`) with the node's real CPU cores,
# where its logical CPUs are more (the embedded head's are): jobs whose ranks would each
# get too small a share of them are refused.
CORES_LABEL = "shardline.io/cores"


def supervisor_name(job_id: str) -> str:
    return f"shardline-job-{job_id}"


# A job's placement group is this and its id: the cluster page finds each job's holdings.
PLACEMENT_GROUP_PREFIX = "shardline-job-"


def placement_group_name(job_id: str) -> str:
    return f"{PLACEMENT_GROUP_PREFIX}{job_id}"


def worker_name(job_id: str, attempt: int, rank: int) -> str:
    return f"shardline-job-{job_id}-a{attempt}-rank-{rank}"


# The control plane's warm pool of started rank processes (workers/runtime/warm_pool.py).
WARM_POOL_NAME = "shardline-warm-pool"
