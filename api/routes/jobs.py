"""/v1/jobs: submit, list, read, cancel, and what a job produced (logs: routes/logs.py)."""

from __future__ import annotations

import json
import logging
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from shardline.api.bodies import parse_body
from shardline.api.deps import (
    AdmissionDep,
    BearerDep,
    CurrentUser,
    Keep,
    Outcome,
    RuntimeDep,
    SettingsDep,
    StoreDep,
    authenticated,
    read_as,
    views_of,
)
from shardline.api.errors import ApiError
from shardline.api.json_body import encoded_response, json_body, json_bytes
from shardline.api.openapi import error_responses, request_body
from shardline.api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    DeletedJobPublic,
    EventPublic,
    EventsPublic,
    JobPublic,
    JobsPublic,
    MetricsPublic,
)
from shardline.service.models import Checkpoint, JobEvent
from shardline.service.principal import Principal
from shardline.service.store import JobNotFound
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.sections import MAX_STEPS
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)
router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 404, 422, 429, 503)
)

# Databases compare with signed 64-bit integers; a larger bound overflows the driver.
MAX_INT64 = 2**63 - 1


def parse_spec(raw: bytes, content_type: str | None = None) -> JobSpec:
    """Body bytes -> JobSpec, every failure a 4xx with the error shape."""
    spec = parse_body(raw, content_type, JobSpec, "a job spec")
    # The stored spec is read back by the scheduler, listings and workers: it must be JSON.
    try:
        json.dumps(spec.model_dump(mode="json"), allow_nan=False).encode("utf-8")
    except ValueError as err:
        raise ApiError(422, "validation_error", f"the spec cannot be stored: {err}") from None
    return spec


@router.post(
    "",
    status_code=201,
    response_model=JobPublic,
    openapi_extra=request_body(JobSpec),
    responses={
        200: {"model": JobPublic, "description": "Idempotent replay"},
        **error_responses(400, 403, 409, 413, 415, 429),
    },
)
async def submit_job(
    request: Request,
    user: CurrentUser,
    admission: AdmissionDep,
    runtime: RuntimeDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Any:
    """Queue a training job. Same Idempotency-Key and body: the same job (200)."""
    spec = parse_spec(await request.body(), request.headers.get("content-type"))
    # The cluster query and the database are blocking calls: run them in a worker thread
    # so one slow submit does not stall every other request on the event loop.
    job, created = await run_in_threadpool(admission.admit, spec, user, idempotency_key)
    if created:
        runtime.queue_changed()
    body = JobPublic.of(job).model_dump(mode="json")
    return JSONResponse(body, status_code=201 if created else 200)


@router.get("", response_model=JobsPublic)
async def list_jobs(
    request: Request,
    credentials: BearerDep,
    state: JobState | None = None,
    limit: Annotated[int, Query(ge=1)] = 50,
    cursor: Annotated[str | None, Query(max_length=200)] = None,
) -> Response:
    """Newest first; pass `next_cursor` back as `cursor` for the next page."""
    views, settings = views_of(request), request.app.state.settings
    limit = min(limit, settings.max_page_size)

    def page_body(user: Principal) -> bytes:
        page = views.page(user, state=state, limit=limit, cursor=cursor)
        return json_bytes(
            {"jobs": [JobPublic.fields(j) for j in page.jobs], "next_cursor": page.next_cursor}
        )

    # A page depends on who reads it: kept per user (and the admin flag it was read under).
    keep: Keep[bytes] = Keep(lambda user: ("page", user.id, user.is_admin, state, limit, cursor))
    try:
        body = await read_as(request, credentials, page_body, few_rows=True, keep=keep)
    except ValueError as err:
        raise ApiError(
            422, "validation_error", str(err), [{"field": "cursor", "message": str(err)}]
        ) from None
    return encoded_response(body)


@router.get("/{job_id}", response_model=JobPublic)
async def get_job(job_id: str, request: Request, credentials: BearerDep) -> Response:
    views = views_of(request)

    def lookup(token_hash: str) -> tuple[Principal | None, Outcome[tuple[int, bytes]]]:
        user, view = views.get_for_token(job_id, token_hash)
        if user is not None and view is None:
            return user, Outcome(error=JobNotFound(f"no job {job_id}"))
        if view is None:  # an unknown or revoked token: a 401
            return user, Outcome()
        return user, Outcome(value=(view.owner_id, json_bytes(JobPublic.one(view))))

    # Kept once for every reader: each given it only if they may see the job.
    keep: Keep[tuple[int, bytes]] = Keep(
        lambda _user: ("job", job_id),
        visible=lambda user, kept: user.is_admin or user.id == kept[0],
    )
    _, body = await authenticated(request, credentials, lookup, few_rows=True, keep=keep)
    return encoded_response(body)


def json_response(model: BaseModel) -> Response:
    """`model` serialized once: returned as a model, FastAPI would validate it against the
    response model again first (a second pass over every stored spec)."""
    return Response(model.model_dump_json(), media_type="application/json")


@router.post(
    "/{job_id}/cancel", status_code=202, response_model=JobPublic, responses=error_responses(409)
)
def cancel_job(job_id: str, user: CurrentUser, store: StoreDep) -> JobPublic:
    """Ask the job to stop: CANCELLING, then CANCELLED once its workers are gone."""
    return JobPublic.of(store.request_cancel(job_id, user, f"cancel requested by {user.name}"))


@router.post(
    "/{job_id}/pause", status_code=202, response_model=JobPublic, responses=error_responses(409)
)
def pause_job(job_id: str, user: CurrentUser, store: StoreDep) -> JobPublic:
    """Checkpoint the job and free its workers: PAUSING, then PAUSED (RUNNING jobs only)."""
    return JobPublic.of(store.request_pause(job_id, user, f"pause requested by {user.name}"))


@router.post(
    "/{job_id}/resume", status_code=202, response_model=JobPublic, responses=error_responses(409)
)
def resume_job(job_id: str, user: CurrentUser, store: StoreDep, runtime: RuntimeDep) -> JobPublic:
    """Queue a PAUSED job again; it continues from the checkpoint its pause saved."""
    job = store.request_resume(job_id, user, f"resume requested by {user.name}")
    runtime.queue_changed()
    return JobPublic.of(job)


@router.delete("/{job_id}", response_model=DeletedJobPublic, responses=error_responses(404, 409))
async def delete_job(
    job_id: str, user: CurrentUser, store: StoreDep, settings: SettingsDep
) -> DeletedJobPublic:
    """Delete an ended job: its record, events, metrics, logs and checkpoints. What is
    kept is who deleted which job when. Refused (409) while it has not ended, or while a
    job that has not ended starts from its checkpoints."""
    deleted = await run_in_threadpool(store.delete, job_id, user)
    try:
        await run_in_threadpool(settings.job_layout(job_id).remove)
        removed = True
    except OSError as err:  # the rows are gone: the files are an operator's to remove
        log.warning("job %s deleted, but its files could not be: %s", job_id, err)
        removed = False
    return DeletedJobPublic(
        id=deleted.id,
        name=deleted.name,
        state=JobState(deleted.state),
        steps_trained=deleted.steps_trained,
        deleted_at=deleted.deleted_at,
        files_removed=removed,
    )


@router.get("/{job_id}/events", response_model=EventsPublic)
async def job_events(
    job_id: str,
    request: Request,
    credentials: BearerDep,
    after: Annotated[int, Query(ge=0, le=MAX_INT64)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> Response:
    views, store = views_of(request), request.app.state.store

    def read(user: Principal) -> list[JobEvent]:
        views.check_visible(job_id, user)
        return store.events(job_id, after_id=after, limit=limit)

    events = await read_as(request, credentials, read)
    return json_response(EventsPublic(events=[EventPublic.of(e) for e in events]))


@router.get("/{job_id}/metrics", response_model=MetricsPublic)
async def job_metrics(
    job_id: str,
    request: Request,
    credentials: BearerDep,
    # Steps are bounded by the spec (and stored as 32-bit integers): a larger one would
    # overflow PostgreSQL's comparison.
    since_step: Annotated[int, Query(ge=0, le=MAX_STEPS)] = 0,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> Response:
    """Logged steps after `since_step`, in order."""
    views = views_of(request)
    rows = await read_as(
        request,
        credentials,
        lambda user: views.metrics(job_id, user, since_step=since_step, limit=limit),
    )
    return json_body(MetricsPublic.rows(rows))


@router.get("/{job_id}/checkpoints", response_model=CheckpointsPublic)
async def job_checkpoints(job_id: str, request: Request, credentials: BearerDep) -> Response:
    """Committed checkpoints only: a partial one is never reported."""
    views, store = views_of(request), request.app.state.store

    def read(user: Principal) -> list[Checkpoint]:
        views.check_visible(job_id, user)
        return store.checkpoints(job_id)

    checkpoints = await read_as(request, credentials, read)
    return json_response(
        CheckpointsPublic(checkpoints=[CheckpointPublic.of(c) for c in checkpoints])
    )
