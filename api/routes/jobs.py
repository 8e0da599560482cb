"""/v1/jobs: submit, list, read, cancel, and what a job produced (logs: routes/logs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel

from api.bodies import parse_body
from api.deps import (
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
from api.errors import ApiError, checkpoint_storage
from api.init_from import resolve_spec_init_from
from api.json_body import encoded_response, json_body, json_bytes
from api.openapi import error_responses, request_body
from api.schemas import (
    CheckpointPublic,
    CheckpointsPublic,
    EventPublic,
    EventsPublic,
    JobPublic,
    JobsPublic,
    MetricsPublic,
)
from service.config import Settings
from service.layout_planning import NoLayout, choose_layout
from service.models import Checkpoint, Job, JobEvent
from service.principal import Principal, Viewer
from service.quotas import UserQuotas, never_fits_quota, resource_limits
from service.store import JobNotFound, JobStore
from workers.contract.data_access import DataAccess
from workers.contract.demand import job_demand
from workers.contract.events import Event
from workers.contract.lifecycle import JobState
from workers.contract.sections import INIT_FROM, MAX_STEPS
from workers.contract.spec import JobSpec

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


def check_data_path(spec: JobSpec, settings: Settings) -> None:
    """A job may only read data inside the configured data roots, and never the service's
    own state (admin token, database) or storage. The worker checks every file again when
    it opens it; this answers early. Messages never show the server's absolute roots."""
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    for field, value in (
        ("data.path", spec.data.path),
        ("data.tokenizer", spec.data.tokenizer),
        ("model.init_from", spec.model.init_from),
    ):
        if value is None or (field == "data.tokenizer" and value in ("byte", INIT_FROM)):
            continue
        reason = _path_refusal(Path(value), access)
        if reason is not None:
            raise ApiError(
                422,
                "validation_error",
                f"{field}: {value} {reason}",
                [{"field": field, "message": reason}],
            )


def _path_refusal(path: Path, access: DataAccess) -> str | None:
    try:
        real = path.resolve()
        holds_private = real.is_dir() and any(p.is_relative_to(real) for p in access.private)
    except (OSError, RuntimeError) as err:  # a symlink loop, a name too long, ...
        return f"cannot be resolved ({type(err).__name__}); give an existing file or folder"
    if holds_private:
        return "holds the service's own state or storage, which is never data"
    refused = access.refusal(real)
    if refused is not None:
        return refused
    return _missing(path, real, access)


def _missing(path: Path, real: Path, access: DataAccess) -> str | None:
    """Why an allowed path cannot be read at all (the job would fail minutes later), or
    None. A relative path is read from the server's working directory, as the worker does."""
    relative = "" if path.is_absolute() else " (a relative path is read from the server's folder)"
    if not real.exists():
        return f"does not exist{relative}; give a file or folder inside the data roots"
    if not os.access(real, os.R_OK | (os.X_OK if real.is_dir() else 0)):
        return "is not readable by the server; check its permissions"
    return None


def check_resume_from(spec: JobSpec, user: Viewer, store: JobStore, settings: Settings) -> None:
    """`resume_from` must name a job the user may see (404 otherwise, as for any other
    user's job) that has the committed checkpoint asked for."""
    source = spec.resume_from
    if source is None:
        return
    job = store.get(source.job_id, user)
    with checkpoint_storage():
        found = settings.job_layout(job.id).checkpoints().find(source.step)
    if found is None:
        which = f"at step {source.step}" if source.step else "yet"
        raise ApiError(
            422,
            "validation_error",
            f"resume_from: job {job.id} has no committed checkpoint {which}",
            [
                {
                    "field": "resume_from.step" if source.step else "resume_from.job_id",
                    "message": f"no committed checkpoint {which}",
                }
            ],
        )


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
    store: StoreDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
    idempotency_key: Annotated[str | None, Header(max_length=255)] = None,
) -> Any:
    """Queue a training job. Same Idempotency-Key and body: the same job (200)."""
    spec = parse_spec(await request.body(), request.headers.get("content-type"))
    if spec.priority > 0 and not user.is_admin:
        # As with PATCH: raising a job above the others is an administrator's call.
        message = "above 0 is for administrators; leave it out (0) or give a lower one"
        raise ApiError(
            403, "forbidden", f"priority: {message}", [{"field": "priority", "message": message}]
        )

    def admit() -> tuple[Job, bool]:
        check_data_path(spec, settings)
        resolved = resolve_spec_init_from(spec, settings)
        check_resume_from(resolved, user, store, settings)
        events: tuple[Event, ...] = ()
        auto = resolved.parallel.auto
        # A replay answers with the job already made, whatever is free now.
        if auto and not store.submitted_with_key(user, idempotency_key):
            try:
                rates = request.app.state.rates.for_spec(resolved)
                resolved, planned = choose_layout(
                    resolved, runtime, resource_limits(settings), rates
                )
            except NoLayout as err:
                raise ApiError(422, "does_not_fit", str(err)) from None
            events = (planned,)
        refusal = runtime.refusal(resolved) or never_fits_quota(
            job_demand(resolved), resource_limits(settings)
        )
        if refusal is not None:
            raise ApiError(422, "does_not_fit", refusal)
        quotas: UserQuotas = request.app.state.quotas
        return quotas.submit(
            user,
            idempotency_key,
            lambda: store.create(
                user, resolved, idempotency_key, submitted=spec if auto else None, events=events
            ),
        )

    # The cluster query and the database are blocking calls: run them in a worker thread
    # so one slow submit does not stall every other request on the event loop.
    job, created = await run_in_threadpool(admit)
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
        return user, Outcome(value=(view.owner_id, json_bytes(JobPublic.fields(view))))

    # Kept once for every reader: each given it only if they may see the job.
    keep: Keep[tuple[int, bytes]] = Keep(
        lambda _user: ("job", job_id),
        visible=lambda user, kept: user.is_admin or user.id == kept[0],
        hidden=lambda: JobNotFound(f"no job {job_id}"),
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
