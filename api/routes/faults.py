"""POST /v1/jobs/{id}/faults: chaos testing, for administrators only.

An admin makes one rank of a running job fail (killed, hung, raising, or with a loss that
is not finite) to check and measure how the job recovers (bench/recovery.py).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel

from shardline.api.bodies import parse_body
from shardline.api.deps import CurrentUser, RuntimeDep, StoreDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses, request_body
from shardline.api.schemas import FaultCreate
from shardline.service.runtime import FaultNotDelivered
from shardline.workers.contract.faults import FaultKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)

router = APIRouter(
    prefix="/v1/jobs",
    tags=["faults"],
    responses=error_responses(401, 403, 404, 409, 422, 429, 503),
)


class FaultPublic(BaseModel):
    job_id: str
    kind: FaultKind
    rank: int
    message: str


@router.post(
    "/{job_id}/faults",
    status_code=202,
    response_model=FaultPublic,
    openapi_extra=request_body(FaultCreate),
    responses=error_responses(400, 415),
)
async def inject_fault(
    job_id: str, request: Request, user: CurrentUser, store: StoreDep, runtime: RuntimeDep
) -> FaultPublic:
    """Make rank `rank` of a RUNNING job fail: `kill` (its process dies), `hang` (its
    training stops), `raise` (its next step raises) or `nan` (its next loss is not
    finite). The job's events then show how it recovered."""
    if not user.is_admin:
        raise ApiError(403, "forbidden", "fault injection is for administrators only")
    fault = parse_body(
        await request.body(), request.headers.get("content-type"), FaultCreate, "a fault"
    )

    def deliver() -> FaultPublic:
        job = store.get(job_id, user)
        world_size = JobSpec.model_validate(job.spec).parallel.world_size
        if fault.rank >= world_size:
            message = f"the job has ranks 0 to {world_size - 1}; pick one of them"
            raise ApiError(
                422,
                "validation_error",
                f"rank: {message}",
                [{"field": "rank", "message": message}],
            )
        if job.state != JobState.RUNNING:
            raise ApiError(
                409, "conflict", f"job {job_id} is {job.state}; faults go to RUNNING jobs only"
            )
        try:
            runtime.inject_fault(job_id, fault.kind.value, fault.rank)
        except FaultNotDelivered as err:
            raise ApiError(409, "conflict", f"the fault was not delivered: {err}") from None
        log.warning("job %s: %s injected %s on rank %d", job_id, user.name, fault.kind, fault.rank)
        return FaultPublic(
            job_id=job_id,
            kind=fault.kind,
            rank=fault.rank,
            message=f"{fault.kind.value} delivered to rank {fault.rank}",
        )

    # The store and the runtime block (a Ray round trip): keep them off the event loop.
    return await run_in_threadpool(deliver)
