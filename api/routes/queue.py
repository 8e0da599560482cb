"""The cluster and the queue: GET /v1/cluster (resources, each node and what holds it,
the queued jobs in admission order) and PATCH /v1/jobs/{id} (a job's priority, which
changes that order)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy import func, select

from shardline.api.bodies import parse_body
from shardline.api.deps import CurrentUser, DatabaseDep, RuntimeDep, StoreDep
from shardline.api.openapi import error_responses, request_body
from shardline.api.schemas import (
    ClusterPublic,
    HoldingPublic,
    JobPatch,
    JobPublic,
    NodePublic,
    QueuedPublic,
    utc,
)
from shardline.service.cluster_view import NodeInfo
from shardline.service.db import Database
from shardline.service.models import Job
from shardline.service.principal import Viewer
from shardline.service.queue import queued_in_order, set_priority

# Tagged per route: PATCH /v1/jobs/{id} is about a job, not the cluster.
router = APIRouter(responses=error_responses(401, 429, 503))


@router.get("/v1/cluster", response_model=ClusterPublic, tags=["cluster"])
def cluster(user: CurrentUser, runtime: RuntimeDep, db: DatabaseDep) -> ClusterPublic:
    """Ray's resources, each node with what every job's ranks hold there, jobs by state
    and the queue in the order the scheduler considers it. An administrator sees every
    user's jobs; anyone else sees their own by name (others' only as resources held)."""
    info = runtime.cluster()
    query = select(Job.state, func.count()).group_by(Job.state)
    if not user.is_admin:
        query = query.where(Job.owner_id == user.id)
    with db.session() as s:
        counts = dict(s.execute(query).all())
    return ClusterPublic(
        runtime=info.runtime,
        connected=info.connected,
        message=info.message,
        resources=info.resources,
        available=info.available,
        jobs={str(k): int(v) for k, v in counts.items()},
        nodes=_nodes(db, user, info.nodes),
        queue=[
            QueuedPublic(**(vars(q) | {"created_at": utc(q.created_at)}))
            for q in queued_in_order(db, user)
        ],
    )


def _nodes(db: Database, user: Viewer, nodes: list[NodeInfo]) -> list[NodePublic]:
    ids = {h.job_id for n in nodes for h in n.held}
    with db.session() as s:
        rows = s.execute(select(Job.id, Job.name, Job.owner_id).where(Job.id.in_(ids))).all()
    named = {r.id: r.name for r in rows if user.is_admin or r.owner_id == user.id}
    return [
        NodePublic(
            node_id=n.node_id,
            address=n.address,
            alive=n.alive,
            resources=n.resources,
            held=[
                HoldingPublic(
                    job_id=h.job_id if h.job_id in named else None,
                    name=named.get(h.job_id),
                    ranks=h.ranks,
                    resources=h.resources,
                )
                for h in n.held
            ],
        )
        for n in nodes
    ]


@router.patch(
    "/v1/jobs/{job_id}",
    response_model=JobPublic,
    tags=["jobs"],
    openapi_extra=request_body(JobPatch),
    responses=error_responses(400, 403, 404, 409, 415, 422),
)
async def patch_job(
    job_id: str, request: Request, user: CurrentUser, store: StoreDep, runtime: RuntimeDep
) -> JobPublic:
    """Change a job's priority while it has not ended (a queued job is considered in
    priority order, then oldest first). An administrator may set any priority; an owner
    may lower their own."""
    patch = parse_body(
        await request.body(), request.headers.get("content-type"), JobPatch, "a job change"
    )
    job = await run_in_threadpool(set_priority, store, job_id, user, patch.priority)
    runtime.queue_changed()  # a job that moved up may fit now
    return JobPublic.of(job)
