"""Profiles on demand: POST /v1/jobs/{id}/profile has every rank of a RUNNING job record
its next N steps with torch.profiler; GET .../profiles/{p} says how far it is, and
GET .../profiles/{p}/trace returns every rank's trace merged into one Chrome trace (open it
in Perfetto or chrome://tracing). The job's owner or an administrator; one at a time."""

from __future__ import annotations

from datetime import UTC, datetime

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse

from shardline.api.bodies import parse_body
from shardline.api.deps import CurrentUser, RuntimeDep, SettingsDep, StoreDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses, request_body
from shardline.api.schemas import ProfileCreate, ProfilePublic
from shardline.service.config import Settings
from shardline.service.models import Job
from shardline.service.principal import Viewer
from shardline.service.profiles import Profiles, ProfileState
from shardline.service.runtime import FaultNotDelivered
from shardline.service.store import JobStore
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec

router = APIRouter(
    prefix="/v1/jobs", tags=["profiles"], responses=error_responses(401, 404, 429, 503)
)


def _public(job_id: str, p: ProfileState) -> ProfilePublic:
    return ProfilePublic(
        id=p.id,
        job_id=job_id,
        steps=p.steps,
        world_size=p.world_size,
        state=p.state,
        ranks_done=p.ranks_done,
        requested_at=datetime.fromtimestamp(p.requested_at, UTC),
        error=p.error,
        trace=f"/v1/jobs/{job_id}/profiles/{p.id}/trace" if p.state == "done" else None,
    )


def _profiles(
    job_id: str, user: Viewer, store: JobStore, settings: Settings
) -> tuple[Profiles, Job]:
    """The job's profiles and the job (404 for a job the user may not see)."""
    job = store.get(job_id, user)
    return Profiles(settings.job_layout(job.id).profiles_dir), job


def _running_version(job: Job) -> int | None:
    """The job's version while it is RUNNING; None otherwise (no profile can finish then)."""
    return job.version if job.state == JobState.RUNNING else None


@router.post(
    "/{job_id}/profile",
    status_code=202,
    response_model=ProfilePublic,
    openapi_extra=request_body(ProfileCreate),
    responses=error_responses(400, 409, 415, 422),
)
async def start_profile(
    job_id: str,
    request: Request,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    runtime: RuntimeDep,
) -> ProfilePublic:
    """Record the next `steps` (1-20, default 3) steps of every rank of a RUNNING job;
    training goes on meanwhile. Poll the answer's profile until `state` is `done`."""
    raw = await request.body()
    asked = parse_body(
        raw or b"{}",
        request.headers.get("content-type") or "application/json",
        ProfileCreate,
        "a profile request",
    )

    def begin() -> ProfilePublic:
        profiles, job = _profiles(job_id, user, store, settings)
        version = _running_version(job)
        if version is None:
            raise ApiError(
                409, "conflict", f"job {job_id} is {job.state}; only a RUNNING job can be profiled"
            )
        world = JobSpec.model_validate(job.spec).parallel.world_size
        profile_id = profiles.begin(asked.steps, world, version)
        try:
            # A shrunk elastic job runs fewer ranks than its spec: wait for those only.
            profiles.sent_to(profile_id, runtime.profile(job_id, profile_id, asked.steps))
        except FaultNotDelivered as err:
            profiles.fail(profile_id, f"the request did not reach the ranks: {err}")
            raise ApiError(409, "conflict", f"the profile was not started: {err}") from None
        return _public(job_id, profiles.state(profile_id, version))

    # The store and the runtime block (a Ray round trip): keep them off the event loop.
    return await run_in_threadpool(begin)


@router.get("/{job_id}/profiles/{profile_id}", response_model=ProfilePublic)
def profile_state(
    job_id: str, profile_id: str, user: CurrentUser, store: StoreDep, settings: SettingsDep
) -> ProfilePublic:
    """How far a profile is: `recording`, `done` (with `trace`) or `failed` (with `error`)."""
    profiles, job = _profiles(job_id, user, store, settings)
    return _public(job_id, profiles.state(profile_id, _running_version(job)))


@router.get(
    "/{job_id}/profiles/{profile_id}/trace",
    response_class=FileResponse,
    responses={
        200: {
            "description": "A Chrome trace (JSON)",
            "content": {"application/json": {"schema": {"type": "object"}}},
        },
        **error_responses(409),
    },
)
def profile_trace(
    job_id: str, profile_id: str, user: CurrentUser, store: StoreDep, settings: SettingsDep
) -> FileResponse:
    """Every rank's trace in one Chrome trace: each rank is a process named "rank R"."""
    profiles, job = _profiles(job_id, user, store, settings)
    state = profiles.state(profile_id, _running_version(job))
    if state.state != "done":
        why = f": {state.error}" if state.error else "; wait until it is done"
        raise ApiError(409, "conflict", f"profile {profile_id} is {state.state}{why}")
    return FileResponse(
        profiles.merged_trace(profile_id),
        media_type="application/json",
        filename=f"profile-{job_id}-{profile_id}.json",
    )
