"""Planning against the cluster: how many ranks it could give a spec now, and the layout
`parallel: auto` takes (the planner and cost model are in workers/contract)."""

from __future__ import annotations

import math

from shardline.service.quotas import never_fits_quota
from shardline.service.rates import PlanningRates
from shardline.service.runtime import ClusterInfo, Runtime
from shardline.workers.contract.demand import bundle_resources, describe, job_demand
from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.planner import PlannedLayout, default_rates, plan
from shardline.workers.contract.rates import Rates
from shardline.workers.contract.sections import ParallelSpec
from shardline.workers.contract.spec import JobSpec

MAX_PLAN_RANKS = 4096


class NoLayout(ValueError):
    """`parallel: auto` found nothing to run on now; the message says why."""


def free_ranks(spec: JobSpec, cluster: ClusterInfo) -> int:
    """How many of the spec's ranks the cluster's free resources hold now."""
    free = cluster.available
    return int(
        min(
            math.floor(free.get(name, 0.0) / amount + 1e-9)
            for name, amount in bundle_resources(spec).items()
        )
    )


def admissible_ranks(spec: JobSpec, runtime: Runtime, quota: dict[str, float] | None = None) -> int:
    """The most ranks of `spec` the cluster has free now and would admit (the refusals at
    submit: a rank's share of a core, host memory, the user's resource quota), found by
    halving."""
    low, high = 0, min(free_ranks(spec, runtime.cluster()), MAX_PLAN_RANKS)
    while low < high:
        mid = (low + high + 1) // 2
        layout = spec.model_copy(update={"parallel": ParallelSpec(dp=mid)})
        over_quota = quota is not None and never_fits_quota(job_demand(layout), quota)
        if not over_quota and runtime.refusal(layout) is None:
            low = mid
        else:
            high = mid - 1
    return low


def _rank_counts(most: int) -> list[int]:
    """The world sizes auto compares: the most there is, and each power of two below it
    (more ranks are not always faster: each adds communication)."""
    return sorted({most, *(2**i for i in range(most.bit_length()) if 2**i <= most)})


def _within_bounds(planned: PlannedLayout, bounds: ParallelSpec) -> bool:
    par = planned.spec.parallel
    return (bounds.max_tp is None or par.tp <= bounds.max_tp) and (
        bounds.max_pp is None or par.pp <= bounds.max_pp
    )


def _describe(p: PlannedLayout) -> str:
    par, tr = p.spec.parallel, p.spec.train
    layout = f"dp={par.dp} tp={par.tp} pp={par.pp} zero={par.zero_stage}"
    if par.pp > 1:
        layout += f" {par.pp_schedule.value}"
    if par.sequence_parallel:
        layout += " sp"
    return (
        f"{layout}, micro-batch {tr.micro_batch_size}, AC {tr.activation_checkpointing.value} "
        f"({p.predicted.step_s:.3g} s a step predicted)"
    )


def auto_base(spec: JobSpec) -> JobSpec:
    """The spec the planner varies: the default layout, auto off (the bounds kept aside),
    with the spec's own choices that are not layout (mixed precision, compression)."""
    par = spec.parallel
    kept = ParallelSpec(
        fsdp_mixed_precision=par.fsdp_mixed_precision, grad_compression=par.grad_compression
    )
    return spec.model_copy(update={"parallel": kept})


def pick_layout(
    spec: JobSpec, rank_counts: list[int], rates: Rates, rates_named: str | None = None
) -> tuple[JobSpec, Event]:
    """The fastest predicted layout over `rank_counts` that fits the device and the spec's
    bounds: the spec with it (auto off), and the event that says why. NoLayout if none."""
    bounds, base = spec.parallel, auto_base(spec)
    candidates: list[PlannedLayout] = []
    for ranks in rank_counts:
        candidates += [
            p
            for p in plan(base, ranks, rates, device_memory=rates.device_memory)
            if p.fits and _within_bounds(p, bounds)
        ]
    most = max(rank_counts)
    if not candidates:
        raise NoLayout(
            f"parallel: auto found no legal layout that fits on up to {most} ranks within "
            "the bounds (max_tp, max_pp) and the device's memory; change the model, batch "
            "or bounds"
        )
    candidates.sort(key=lambda p: p.predicted.step_s)
    best = candidates[0]
    runner_up = candidates[1] if len(candidates) > 1 else None
    reason = (
        f"the fastest of {len(candidates)} layouts that fit on up to {most} ranks, "
        f"by the cost model with {rates_named or f'{rates.device} rates'}"
    )
    message = f"layout chosen: {_describe(best)}; {reason}"
    if runner_up is not None:
        message += f"; runner-up: {_describe(runner_up)}"
    event = Event(
        EventKind.PLANNED,
        message,
        {
            "parallel": best.spec.parallel.model_dump(mode="json"),
            "train": best.to_json()["train"],
            "predicted_step_s": best.predicted.step_s,
            "runner_up": runner_up.to_json() if runner_up is not None else None,
            "ranks": most,
        },
    )
    return best.spec, event


def choose_layout(
    spec: JobSpec,
    runtime: Runtime,
    quota: dict[str, float] | None = None,
    rates: PlanningRates | None = None,
) -> tuple[JobSpec, Event]:
    """`parallel: auto` at submit: the fastest layout on what the cluster has free now and
    the user's `quota` (resource limits) allows, by `rates` (the cluster's calibrated
    ones, where it has them) or the defaults."""
    base = auto_base(spec)
    most = admissible_ranks(base, runtime, quota)
    if most == 0:
        refusal = runtime.refusal(base)  # never, rather than not now: say why
        if refusal is not None:
            raise NoLayout(refusal)
        raise NoLayout(
            "parallel: auto found no free resources for one rank of this job now "
            f"({describe(bundle_resources(spec))}); submit a fixed layout to queue for them"
        )
    rates = rates or PlanningRates(default_rates(spec), None)
    return pick_layout(spec, _rank_counts(most), rates.rates, rates.describe())
