"""Health, readiness and Prometheus metrics (the cluster's state: api/routes/queue.py)."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from shardline.api.deps import CurrentUser, DatabaseDep, TelemetryDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses

router = APIRouter(tags=["system"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process is up (says nothing about its dependencies). Answered on the event loop:
    no hop to the thread pool, whose threads may all be busy with database reads."""
    return {"status": "ok"}


@router.get("/readyz", responses=error_responses(503))
def readyz(db: DatabaseDep) -> dict[str, str]:
    """Ready to serve: the database answers."""
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
def prometheus_metrics(user: CurrentUser, telemetry: TelemetryDep) -> Response:
    """Prometheus exposition, for administrators: it counts every user's jobs and
    requests (scrape it with an admin's token)."""
    if not user.is_admin:
        raise ApiError(
            403, "forbidden", "/metrics is for administrators (it counts every user's jobs)"
        )
    return Response(generate_latest(telemetry.registry), media_type=CONTENT_TYPE_LATEST)
