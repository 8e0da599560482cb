"""The cost model's rates on this cluster: GET /v1/cluster/rates (what `parallel: auto`
and POST /v1/plan plan with) and POST /v1/cluster/calibrate (an administrator measures
them with a Ray task on a cluster node; poll the GET until the calibration is done)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from shardline.api.deps import AdmissionDep, CalibrationDep, CurrentUser, RatesDep, RuntimeDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses
from shardline.service.principal import Principal
from shardline.service.rates import (
    AlreadyCalibrating,
    CalibrationState,
    as_utc,
)
from shardline.workers.contract.rates import MAX_CALIBRATION_RANKS
from shardline.workers.contract.sections import ParallelSpec
from shardline.workers.contract.spec import JobSpec

router = APIRouter(prefix="/v1/cluster", tags=["cluster"], responses=error_responses(401, 429, 503))

# The model calibrated when the request names none: the tiny preset (seconds on a CPU).
DEFAULT_SPEC = {"name": "calibration", "model": {"preset": "tiny"}}


class StoredRates(BaseModel):
    kind: str  # the device class: cpu or gpu
    measured_at: datetime
    source: str
    rates: dict[str, Any]


class CalibrationPublic(BaseModel):
    state: str  # idle | running | done | failed
    kind: str | None = None
    ranks: int | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    message: str | None = None


class RatesPublic(BaseModel):
    stored: list[StoredRates]  # a device class without a row plans with the defaults
    calibration: CalibrationPublic


class CalibrateRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Whose model's compute rate and activation bytes to measure (its devices too).
    spec: JobSpec | None = None
    ranks: Annotated[int, Field(ge=2, le=MAX_CALIBRATION_RANKS, strict=True)] = 2


def _calibration(state: CalibrationState) -> CalibrationPublic:
    return CalibrationPublic(**vars(state))


@router.get("/rates", response_model=RatesPublic)
def cluster_rates(user: CurrentUser, book: RatesDep, calibration: CalibrationDep) -> RatesPublic:
    """The calibrated rates stored per device class, and the last calibration's state."""
    return RatesPublic(
        stored=[
            StoredRates(
                kind=r.kind, measured_at=as_utc(r.measured_at), source=r.source, rates=r.rates
            )
            for r in book.stored()
        ],
        calibration=_calibration(calibration.state()),
    )


def calibrating_admin(user: CurrentUser) -> Principal:
    """The caller, an administrator. A dependency, so that it is decided before the body is
    read: anyone else learns that they may not, not what a valid body would be."""
    if not user.is_admin:
        raise ApiError(403, "forbidden", "calibrating the cluster is for administrators")
    return user


@router.post(
    "/calibrate",
    response_model=CalibrationPublic,
    status_code=202,
    responses=error_responses(403, 409, 422),
)
async def calibrate(
    user: Annotated[Principal, Depends(calibrating_admin)],
    runtime: RuntimeDep,
    admission: AdmissionDep,
    calibration: CalibrationDep,
    body: CalibrateRequest | None = None,
) -> CalibrationPublic:
    """Measure the cost model's rates on a cluster node (an administrator's call: every
    user's `parallel: auto` jobs then plan with them). Answers at once; GET
    /v1/cluster/rates says when it is done and what it stored."""
    request_body = body or CalibrateRequest()
    if not runtime.cluster().connected:
        raise ApiError(503, "no_cluster", "no Ray cluster is attached: nothing to measure")

    def checked() -> JobSpec:
        if request_body.spec is None:
            return JobSpec.model_validate(DEFAULT_SPEC)
        # As at submit: the shape from model.init_from's config.json, data the server may read.
        spec = admission.checked(request_body.spec)
        # One rank of it must fit on a node to be measured there (not its whole layout).
        refusal = runtime.refusal(spec.model_copy(update={"parallel": ParallelSpec()}))
        if refusal is not None:
            raise ApiError(422, "does_not_fit", refusal)
        return spec

    spec = await run_in_threadpool(checked)
    try:
        state = await run_in_threadpool(calibration.start, spec, request_body.ranks, user.name)
    except AlreadyCalibrating as err:
        raise ApiError(409, "calibrating", str(err)) from None
    return _calibration(state)
