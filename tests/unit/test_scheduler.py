"""Admission planning: priority then age, backfill, and no starvation of a big head job."""

from __future__ import annotations

from shardline.service.scheduler import Queued, plan_admissions
from shardline.workers.contract.demand import PROCESS_BYTES, job_demand
from shardline.workers.contract.spec import JobSpec

TOTAL = {"CPU": 8.0, "GPU": 0.0}


def q(job_id: str, cpus: float, waited: float = 0.0) -> Queued:
    return Queued(job_id, {"CPU": cpus, "GPU": 0.0}, waited)


def test_jobs_are_admitted_in_order_while_they_fit() -> None:
    plan = plan_admissions([q("a", 4), q("b", 4), q("c", 2)], {"CPU": 8.0}, TOTAL, 300)
    assert plan.admit == ["a", "b"]
    assert plan.waiting["c"] == "waiting for resources: needs 2 CPU; 0 CPU free of 8 CPU"


def test_smaller_jobs_backfill_past_a_head_that_does_not_fit() -> None:
    plan = plan_admissions([q("big", 8, waited=10), q("small", 2)], {"CPU": 4.0}, TOTAL, 300)
    assert plan.admit == ["small"]
    assert "needs 8 CPU; 4 CPU free" in plan.waiting["big"]


def test_a_head_that_waited_long_enough_holds_the_jobs_behind_it() -> None:
    plan = plan_admissions([q("big", 8, waited=400), q("small", 2)], {"CPU": 4.0}, TOTAL, 300)
    assert plan.admit == []
    assert plan.waiting["small"] == ("held behind job big, which has waited 400s for resources")


def test_demand_is_ranks_times_bundle() -> None:
    spec = JobSpec.model_validate(
        {
            "name": "x",
            "parallel": {"dp": 4},
            "resources": {"cpus_per_worker": 2, "gpus_per_worker": 1},
        }
    )
    # GPU ranks get no warm spares: four processes' memory, no training state on the host.
    assert job_demand(spec) == {"CPU": 8.0, "GPU": 4.0, "memory": 4.0 * PROCESS_BYTES}
