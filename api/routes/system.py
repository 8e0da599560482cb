"""Health, readiness, Prometheus metrics and the cluster's state."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import func, select, text

from api.deps import CurrentUser, RuntimeDep
from api.errors import ApiError
from api.openapi import error_responses
from api.schemas import ClusterPublic
from service.db import Database
from service.models import Job

router = APIRouter(tags=["system"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about its dependencies). Answered on the event loop:
    no hop to the thread pool, whose threads may all be busy with database reads."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
def readyz(request: Request) -> dict[str, str]:
    """Ready to serve: the database answers."""
    db: Database = request.app.state.db
    try:
        with db.session() as s:
            s.execute(text("SELECT 1"))
    except Exception as err:
        raise ApiError(503, "unavailable", f"database unreachable: {type(err).__name__}") from err
    return {"status": "ready"}


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text exposition",
            "content": {CONTENT_TYPE_LATEST.split(";")[0]: {"schema": {"type": "string"}}},
        },
        **error_responses(401, 403, 429, 503),
    },
)
def prometheus_metrics(request: Request, user: CurrentUser) -> Response:
    """Prometheus exposition, for administrators: it counts every user's jobs and
    requests (scrape it with an admin's token)."""
    if not user.is_admin:
        raise ApiError(
            403, "forbidden", "/metrics is for administrators (it counts every user's jobs)"
        )
    registry = request.app.state.telemetry.registry
    return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/cluster", response_model=ClusterPublic, responses=error_responses(401, 429, 503))
def cluster(request: Request, user: CurrentUser, runtime: RuntimeDep) -> ClusterPublic:
    """Ray's resources, and jobs by state: every user's for an administrator, the caller's
    own for anyone else."""
    info = runtime.cluster()
    db: Database = request.app.state.db
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
    )
