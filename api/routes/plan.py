"""POST /v1/plan: the layouts of a spec on the ranks the cluster could give it now."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field

from shardline.api.deps import AdmissionDep, CurrentUser, RatesDep, RuntimeDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses
from shardline.service.layout_planning import MAX_PLAN_RANKS, admissible_ranks
from shardline.service.rates import PlanningRates
from shardline.workers.contract.demand import bundle_resources, describe
from shardline.workers.contract.spec import JobSpec

router = APIRouter(prefix="/v1", tags=["plan"], responses=error_responses(401, 422, 429, 503))

# What one plan may cost (a spec on thousands of ranks has hundreds of thousands of layouts).
MAX_PLANNED_LAYOUTS = 20_000
PLAN_CPU_S = 5.0


class PlanRequest(BaseModel):
    # As the spec: unknown fields refused, and a count is a JSON number ("4" is not 4).
    model_config = ConfigDict(extra="forbid")

    spec: JobSpec
    # Default: as many ranks as the cluster's free resources hold now (by the spec's
    # resources per worker) and would admit.
    ranks: Annotated[int, Field(ge=1, le=MAX_PLAN_RANKS, strict=True)] | None = None
    gpus_per_node: Annotated[int, Field(ge=1, le=1024, strict=True)] | None = None
    device_memory: Annotated[int, Field(ge=1, strict=True)] | None = None
    limit: Annotated[int, Field(ge=1, le=1000, strict=True)] = 20


class PlanPublic(BaseModel):
    ranks: int
    device: str
    rates: str  # which rates: the device's defaults, or when this cluster's were calibrated
    legal: int  # how many legal layouts there are (the list holds the first `limit`)
    layouts: list[dict[str, Any]]


@router.post("/plan", response_model=PlanPublic)
async def plan_layouts(
    request: Request,
    body: PlanRequest,
    user: CurrentUser,
    runtime: RuntimeDep,
    admission: AdmissionDep,
    book: RatesDep,
) -> Any:
    """Every legal layout of `spec` on `ranks` ranks (default: what is free now), those
    that fit `device_memory` first, each group fastest first by the cost model. A plan
    predicts at most 20000 layouts in at most 5 s of CPU (422 `plan_too_large` beyond),
    one at a time per user (429)."""
    from shardline.workers.contract.planner import PlanBudget, PlanTooLarge, plan

    def answer() -> PlanPublic:
        # The shapes come from model.init_from's config.json where it names one, as at submit.
        spec = admission.checked(body.spec)
        ranks = body.ranks
        if ranks is None:
            ranks = admissible_ranks(spec, runtime)
            if ranks == 0:
                raise ApiError(
                    422,
                    "does_not_fit",
                    "the cluster has no free resources for one rank of this spec now "
                    f"({describe(bundle_resources(spec))}); give `ranks` to plan anyway",
                )
        planning: PlanningRates = book.for_spec(spec)
        rates = planning.rates
        try:
            planned = plan(
                spec,
                ranks,
                rates,
                ranks_per_node=body.gpus_per_node,
                device_memory=body.device_memory or rates.device_memory,
                budget=PlanBudget(MAX_PLANNED_LAYOUTS, PLAN_CPU_S),
            )
        except PlanTooLarge as err:
            raise ApiError(422, "plan_too_large", str(err)) from None
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
            rates=planning.describe(),
            legal=len(planned),
            layouts=[p.to_json() for p in planned[: body.limit]],
        )

    # Planning 64 ranks is a few hundred milliseconds of CPU: off the event loop.
    with request.app.state.plan_turns.turn(user.id):
        return await run_in_threadpool(answer)
