"""Elastic re-planning: the layout a job goes on in when it cannot get all its ranks.

The whole layout is planned again for fewer ranks, over every dimension the planner
varies (dp, tp, pp and its schedule, ZeRO stage, sequence parallel, micro-batch,
activation checkpointing), by the cost model with the cluster's calibrated rates for the
job's device (published by the control plane; else the defaults): a
tp2 x dp2 job that loses two of its four ranks may go on at dp2 or pp2, not only at tp2 x
dp1. The global batch stays, and the batch of a step depends only on (seed, step), so a
re-planned job trains on exactly the data it would have seen; a restart restores the
newest checkpoint or snapshot resharded into the new layout, and its losses continue.
"""

from __future__ import annotations

from shardline.workers.contract.demand import elastic_min_ranks
from shardline.workers.contract.planner import plan
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.cluster_rates import planning_rates


def replan(full: JobSpec, ranks: int) -> JobSpec | None:
    """The planner's fastest layout of `full` on `ranks` ranks that fits the device, or
    None if it has no legal one there."""
    rates = planning_rates(full)
    # min_dp bounds the ranks (elastic_min_ranks), not each layout's dp: pp2 x dp1 is a fine way
    # to go on for a job that asked for tp2 x dp2 and min_dp 2.
    base = full
    if full.fault_tolerance.elastic is not None:
        elastic = full.fault_tolerance.elastic.model_copy(update={"min_dp": 1})
        base = full.model_copy(
            update={"fault_tolerance": full.fault_tolerance.model_copy(update={"elastic": elastic})}
        )
    for planned in plan(base, ranks, rates, device_memory=rates.device_memory):
        if planned.fits:
            return planned.spec
    return None


def next_smaller(running: JobSpec, full: JobSpec) -> JobSpec | None:
    """The layout on the most ranks below `running`'s (down to `elastic_min_ranks(full)`) with
    a legal one, planned again from `full`; None if there is none or the job is not
    elastic."""
    fewest = elastic_min_ranks(full)
    if fewest is None:
        return None
    for ranks in range(running.parallel.world_size - 1, max(fewest, 1) - 1, -1):
        layout = replan(full, ranks)
        if layout is not None:
            return layout
    return None


def describe_layout(spec: JobSpec) -> str:
    """`dp=2 tp=1 pp=1 (2 ranks)` (the schedule too where pp > 1), as events name a
    layout."""
    par = spec.parallel
    text = f"dp={par.dp} tp={par.tp} pp={par.pp}"
    if par.pp > 1:
        text += f" {par.pp_schedule.value}"
    return text + f" ({par.world_size} rank{'s' if par.world_size != 1 else ''})"
