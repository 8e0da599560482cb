"""Host memory and CPU cores in admission: warm spares counted, memory waited for where the
cluster reports it, and jobs whose ranks would crowd the cores refused with the numbers."""

from __future__ import annotations

from typing import Any

from shardline.service.ray_runtime import node_cores
from shardline.service.scheduler import Queued, plan_admissions
from shardline.workers.contract.demand import (
    PROCESS_BYTES,
    TRAINING_BYTES_PER_PARAM,
    cluster_refusal,
    core_share_refusal,
    host_memory,
    job_demand,
)
from shardline.workers.contract.spec import JobSpec

GIB = float(1 << 30)


def spec(**fields: Any) -> JobSpec:
    dp = fields.get("parallel", {}).get("dp", 1)
    train = {"global_batch_size": dp, "micro_batch_size": 1}
    return JobSpec.model_validate(
        {"name": "x", "model": {"preset": "tiny"}, "train": train, **fields}
    )


def test_warm_spares_double_the_processes_and_can_be_turned_off() -> None:
    state = spec().model.parameter_count() * TRAINING_BYTES_PER_PARAM
    on = spec(parallel={"dp": 4})
    off = spec(parallel={"dp": 4}, fault_tolerance={"warm_spares": False})
    never_restarts = spec(parallel={"dp": 4}, fault_tolerance={"max_failures": 0})
    # By default snapshots in host memory keep a second copy of the training state.
    assert host_memory(on) == 8 * PROCESS_BYTES + 2 * state
    assert host_memory(off) == 4 * PROCESS_BYTES + 2 * state
    # A job that never restarts has neither spares nor snapshots by default.
    assert host_memory(never_restarts) == 4 * PROCESS_BYTES + state
    no_snapshots = spec(parallel={"dp": 4}, checkpoint={"memory_every_steps": 0})
    assert host_memory(no_snapshots) == 8 * PROCESS_BYTES + state
    every_5 = spec(parallel={"dp": 4}, checkpoint={"memory_every_steps": 5})
    assert host_memory(every_5) == host_memory(on)


def test_a_job_waits_for_memory_with_the_numbers() -> None:
    need = {"CPU": 2.0, "GPU": 0.0, "memory": 3 * GIB}
    free = {"CPU": 8.0, "GPU": 0.0, "memory": 2 * GIB}
    total = {"CPU": 8.0, "GPU": 0.0, "memory": 16 * GIB}
    plan = plan_admissions([Queued("a", need, 0.0)], free, total, 300)
    assert plan.admit == []
    assert plan.waiting["a"] == (
        "waiting for resources: needs 2 CPU, 3.0 GiB of host memory; "
        "8 CPU, 2.0 GiB of host memory free of 8 CPU, 16.0 GiB of host memory"
    )
    # Two jobs that fit alone: the second waits for the memory the first took.
    half = {"CPU": 1.0, "GPU": 0.0, "memory": 10 * GIB}
    free["memory"] = 16 * GIB
    plan = plan_admissions([Queued("b", half, 0.0), Queued("c", half, 0.0)], free, total, 300)
    assert plan.admit == ["b"] and "host memory" in plan.waiting["c"]


def test_memory_is_not_held_against_a_cluster_that_reports_none() -> None:
    need = {"CPU": 2.0, "GPU": 0.0, "memory": 3 * GIB}
    plan = plan_admissions([Queued("a", need, 0.0)], {"CPU": 8.0, "GPU": 0.0}, {"CPU": 8.0}, 300)
    assert plan.admit == ["a"]


def test_a_job_whose_processes_no_cluster_could_hold_is_refused_naming_the_switch() -> None:
    job = spec(parallel={"dp": 8})
    total = {"CPU": 64.0, "GPU": 0.0, "memory": 5 * GIB}
    reason = cluster_refusal(job, total)
    assert reason is not None
    assert "8 ranks and as many warm spares at 512 MiB each" in reason
    assert "5.0 GiB" in reason and "fault_tolerance.warm_spares: false" in reason
    # Without spares the same job fits.
    assert (
        job_demand(spec(parallel={"dp": 8}, fault_tolerance={"warm_spares": False}))["memory"]
        <= total["memory"]
    )


def test_ranks_crowding_the_cores_are_refused_with_the_numbers() -> None:
    forty = spec(parallel={"dp": 40}, resources={"cpus_per_worker": 0.1})
    reason = core_share_refusal(forty, cores=2, min_share=0.25)
    assert reason == (
        "the job's 40 ranks would share the cluster's 2 CPU cores, 0.05 of a core each; a "
        "rank needs at least 0.25 of a core (SHARDLINE_MIN_CORE_SHARE) to keep up with its "
        "collectives: use at most 8 ranks (parallel.dp x tp x pp), or add nodes"
    )
    assert core_share_refusal(spec(parallel={"dp": 8}), cores=2, min_share=0.25) is None
    assert core_share_refusal(forty, cores=2, min_share=0.0) is None  # the check turned off


def test_a_node_counts_its_labelled_cores_else_its_cpus() -> None:
    labelled = {"Resources": {"CPU": 8.0}, "Labels": {"shardline.io/cores": "2"}}
    assert node_cores(labelled) == 2.0
    assert node_cores({"Resources": {"CPU": 8.0}, "Labels": {}}) == 8.0
    assert node_cores({"Resources": {"CPU": 4.0}, "Labels": {"shardline.io/cores": "x"}}) == 4.0
