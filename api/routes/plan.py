"""POST /v1/plan: the layouts of a spec on the ranks the cluster could give it now."""

from __future__ import annotations

import math
from typing import Annotated, Any

from fastapi import APIRouter
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field

from api.deps import CurrentUser, RuntimeDep
from api.errors import ApiError
from api.openapi import error_responses
from service.runtime import ClusterInfo, Runtime
from workers.contract.cost_model import DEFAULT_RATES, Rates
from workers.contract.demand import bundle_resources
from workers.contract.sections import ParallelSpec
from workers.contract.spec import JobSpec

router = APIRouter(prefix="/v1", tags=["plan"], responses=error_responses(401, 422, 429, 503))

MAX_PLAN_RANKS = 4096


class PlanRequest(BaseModel):
    spec: JobSpec
    # Default: as many ranks as the cluster's free resources hold now (by the spec's
    # resources per worker) and would admit.
    ranks: Annotated[int, Field(ge=1, le=MAX_PLAN_RANKS)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=1024)] | None = None
    device_memory: Annotated[int, Field(ge=1)] | None = None
    limit: Annotated[int, Field(ge=1, le=1000)] = 20


class PlanPublic(BaseModel):
    ranks: int
    device: str
    legal: int  # how many legal layouts there are (the list holds the first `limit`)
    layouts: list[dict[str, Any]]


def free_ranks(spec: JobSpec, cluster: ClusterInfo) -> int:
    """How many of the spec's ranks the cluster's free resources hold now."""
    free = cluster.available
    return int(
        min(
            math.floor(free.get(name, 0.0) / amount + 1e-9)
            for name, amount in bundle_resources(spec).items()
        )
    )


def admissible_ranks(spec: JobSpec, runtime: Runtime) -> int:
    """The most ranks of `spec` the cluster has free now and would admit (the refusals at
    submit: a rank's share of a core, host memory), found by halving."""
    low, high = 0, min(free_ranks(spec, runtime.cluster()), MAX_PLAN_RANKS)
    while low < high:
        mid = (low + high + 1) // 2
        layout = spec.model_copy(update={"parallel": ParallelSpec(dp=mid)})
        if runtime.refusal(layout) is None:
            low = mid
        else:
            high = mid - 1
    return low


def rates_for(spec: JobSpec) -> Rates:
    """Default rates by device (a cluster's calibrated rates are not stored yet)."""
    return DEFAULT_RATES["h100" if spec.resources.gpus_per_worker > 0 else "cpu"]


@router.post("/plan", response_model=PlanPublic)
async def plan_layouts(body: PlanRequest, user: CurrentUser, runtime: RuntimeDep) -> Any:
    """Every legal layout of `spec` on `ranks` ranks (default: what is free now), those
    that fit `device_memory` first, each group fastest first by the cost model."""
    from workers.contract.planner import plan

    def answer() -> PlanPublic:
        ranks = body.ranks
        if ranks is None:
            ranks = admissible_ranks(body.spec, runtime)
            if ranks == 0:
                raise ApiError(
                    422,
                    "does_not_fit",
                    "the cluster has no free resources for one rank of this spec now "
                    f"({bundle_resources(body.spec)}); give `ranks` to plan anyway",
                )
        rates = rates_for(body.spec)
        planned = plan(
            body.spec,
            ranks,
            rates,
            ranks_per_node=body.gpus_per_node,
            device_memory=body.device_memory,
        )
        if not planned:
            raise ApiError(
                422,
                "no_layout",
                f"no legal layout of this spec on {ranks} ranks: dp x tp x pp must be "
                f"{ranks}, with tp dividing the heads and vocabulary, pp the layers, and "
                "dp x micro_batch_size the global batch",
            )
        return PlanPublic(
            ranks=ranks,
            device=rates.device,
            legal=len(planned),
            layouts=[p.to_json() for p in planned[: body.limit]],
        )

    # Planning 64 ranks is a few hundred milliseconds of CPU: off the event loop.
    return await run_in_threadpool(answer)
