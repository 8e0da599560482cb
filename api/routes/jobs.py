"""/v1/jobs: submit, list, read, cancel, and what a job produced."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import ValidationError

from api.deps import CurrentUser, RuntimeDep, SettingsDep, StoreDep
from api.errors import ApiError, validation_failed
from api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    EventPublic,
    EventsPublic,
    JobPublic,
    JobsPublic,
    LogsPublic,
    MetricsPublic,
)
from service.config import Settings
from service.models import Job
from service.states import JobState
from workers.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

_SPEC_BODY = {
    "requestBody": {
        "required": True,
        "content": {"application/json": {"schema": JobSpec.model_json_schema()}},
    }
}


def parse_spec(raw: bytes) -> JobSpec:
    """Body bytes -> JobSpec, every failure a 4xx with the error shape."""
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_body", "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise ApiError(400, "invalid_json", f"the request body is not JSON: {err}") from None
    if not isinstance(data, dict):
        raise ApiError(
            422, "validation_error", f"a job spec is a JSON object, got {type(data).__name__}"
        )
    try:
        return JobSpec.model_validate(data)
    except ValidationError as err:
        raise validation_failed(err.errors()) from None


def check_data_path(spec: JobSpec, settings: Settings) -> None:
    """A job may only read data inside the configured data roots."""
    if spec.data.path is None:
        return
    path = Path(spec.data.path).resolve()
    roots = [root.resolve() for root in settings.data_roots]
    if not any(path.is_relative_to(root) for root in roots):
        raise ApiError(
            422,
            "validation_error",
            f"data.path: {spec.data.path} is outside the data roots this server "
            f"allows ({', '.join(map(str, roots))})",
            [{"field": "data.path", "message": "outside the allowed data roots"}],
        )


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    openapi_extra=_SPEC_BODY,
    responses={200: {"model": JobPublic, "description": "Idempotent replay"}},
)
async def submit_job(
    request: Request,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Any:
    """Queue a training job. Same Idempotency-Key and body: the same job (200)."""
    spec = parse_spec(await request.body())

    def admit() -> tuple[Job, bool]:
        check_data_path(spec, settings)
        refusal = runtime.refusal(spec)
        if refusal is not None:
            raise ApiError(422, "does_not_fit", refusal)
        return store.create(user, spec, idempotency_key)

    # The cluster query and the database are blocking calls: run them in a worker thread
    # so one slow submit does not stall every other request on the event loop.
    job, created = await run_in_threadpool(admit)
    body = JobPublic.of(job).model_dump(mode="json")
    return JSONResponse(body, status_code=201 if created else 200)


@router.get("", response_model=JobsPublic)
def list_jobs(
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> JobsPublic:
    """Newest first; pass `next_cursor` back as `cursor` for the next page."""
    try:
        page = store.list_jobs(
            user, state=state, limit=min(limit, settings.max_page_size), cursor=cursor
        )
    except ValueError as err:
        raise ApiError(
            422, "validation_error", str(err), [{"field": "cursor", "message": str(err)}]
        ) from None
    return JobsPublic(jobs=[JobPublic.of(j) for j in page.jobs], next_cursor=page.next_cursor)


@router.get("/{job_id}", response_model=JobPublic)
def get_job(job_id: str, user: CurrentUser, store: StoreDep) -> JobPublic:
    return JobPublic.of(store.get(job_id, user))


@router.post("/{job_id}/cancel", status_code=202, response_model=JobPublic)
def cancel_job(job_id: str, user: CurrentUser, store: StoreDep) -> JobPublic:
    """Ask the job to stop: CANCELLING, then CANCELLED once its workers are gone."""
    return JobPublic.of(store.request_cancel(job_id, user, f"cancel requested by {user.name}"))


@router.get("/{job_id}/events", response_model=EventsPublic)
def job_events(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    after: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> EventsPublic:
    store.get(job_id, user)
    return EventsPublic(
        events=[EventPublic.of(e) for e in store.events(job_id, after_id=after, limit=limit)]
    )


@router.get("/{job_id}/metrics", response_model=MetricsPublic)
def job_metrics(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    since_step: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> MetricsPublic:
    """Logged steps after `since_step`, in order."""
    store.get(job_id, user)
    return MetricsPublic.of(store.metrics(job_id, since_step=since_step, limit=limit))


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPublic)
def job_checkpoints(job_id: str, user: CurrentUser, store: StoreDep) -> CheckpointsPublic:
    """Committed checkpoints only: a partial one is never reported."""
    store.get(job_id, user)
    return CheckpointsPublic(
        checkpoints=[CheckpointPublic.of(c) for c in store.checkpoints(job_id)]
    )


@router.get("/{job_id}/logs", response_model=LogsPublic)
def job_logs(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    rank: Annotated[int, Query(ge=0)] = 0,
    tail: Annotated[int, Query(ge=1, le=10000)] = 200,
) -> LogsPublic:
    """The last `tail` lines of one rank's log (empty until the job has run)."""
    job = store.get(job_id, user)
    log_dir = settings.resolved_storage_root / job.id / "logs"
    ranks = sorted(
        int(p.stem.removeprefix("rank-"))
        for p in log_dir.glob("rank-*.log")
        if p.stem.removeprefix("rank-").isdigit()
    )
    path = log_dir / f"rank-{rank}.log"
    lines: list[str] = []
    if path.is_file():
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()[-tail:]
    return LogsPublic(rank=rank, lines=lines, ranks=ranks)
