"""parallel.dp_mode 'local_sgd': what it takes, and what it refuses with a fix."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from shardline.workers.contract.local_sgd import DataParallelMode, is_sync_step
from shardline.workers.contract.memory_model import model_state_bytes
from shardline.workers.contract.spec import JobSpec

LOCAL_SGD = {"dp": 2, "dp_mode": "local_sgd"}


def spec(**sections: Any) -> JobSpec:
    return JobSpec.model_validate({"name": "diloco", **sections})


def refusal(**sections: Any) -> str:
    with pytest.raises(ValidationError) as err:
        spec(**sections)
    return str(err.value)


def test_a_local_sgd_job_takes_the_paper_defaults() -> None:
    job = spec(parallel=LOCAL_SGD, checkpoint={"every_steps": 32, "memory_every_steps": 16})
    assert job.parallel.dp_mode == DataParallelMode.local_sgd
    local = job.parallel.local_sgd
    assert (local.sync_every, local.outer_lr, local.outer_momentum) == (16, 0.7, 0.9)
    assert local.delta_dtype.value == "fp32"


@pytest.mark.parametrize(
    ("sections", "says"),
    [
        ({"parallel": {**LOCAL_SGD, "dp": 1}}, "needs parallel.dp >= 2"),
        ({"parallel": {**LOCAL_SGD, "dp": 1, "tp": 2}}, "needs parallel.dp >= 2"),
        ({"parallel": {**LOCAL_SGD, "tp": 2}}, "set tp: 1 and pp: 1"),
        ({"parallel": {**LOCAL_SGD, "zero_stage": 1}}, "needs parallel.zero_stage 0"),
        (
            {"parallel": {**LOCAL_SGD, "grad_compression": {"kind": "bf16"}}},
            "delta_dtype: bf16 halves",
        ),
        ({"parallel": LOCAL_SGD, "precision": "fp16"}, "cannot take precision 'fp16'"),
        (
            {"parallel": LOCAL_SGD, "fault_tolerance": {"elastic": {"min_dp": 1}}},
            "drop fault_tolerance.elastic",
        ),
        (
            {"parallel": LOCAL_SGD, "checkpoint": {"every_steps": 10}},
            "checkpoint.every_steps=10 is not a multiple of parallel.local_sgd.sync_every=16",
        ),
        (
            {"parallel": LOCAL_SGD, "checkpoint": {"memory_every_steps": 4}},
            "make it a multiple of 16",
        ),
        ({"parallel": {"dp": 2, "local_sgd": {"sync_every": 4}}}, "set dp_mode: local_sgd"),
        ({"parallel": {**LOCAL_SGD, "local_sgd": {"sync_every": 1}}}, "greater than or equal"),
        ({"parallel": {"dp": 2, "dp_mode": "hogwild"}}, "'sync', 'local_sgd' or 'async'"),
    ],
)
def test_what_local_sgd_cannot_do_is_refused_with_the_fix(
    sections: dict[str, Any], says: str
) -> None:
    assert says in refusal(**sections)


def test_auto_chooses_the_layout_so_it_takes_no_dp_mode() -> None:
    assert "parallel.auto chooses the layout: drop parallel.dp_mode" in refusal(
        parallel={"auto": True, "dp_mode": "local_sgd"}
    )


def test_replicas_sync_every_so_often_and_after_the_last_step() -> None:
    syncs = [s for s in range(1, 41) if is_sync_step(s, sync_every=16, total_steps=40)]
    assert syncs == [16, 32, 40]


def test_the_memory_model_counts_the_anchors_and_the_outer_momentum() -> None:
    sync = spec(parallel={"dp": 2})
    local = spec(parallel=LOCAL_SGD)
    plain = model_state_bytes(sync.model.resolved(), sync.parallel)
    held = model_state_bytes(local.model.resolved(), local.parallel)
    assert held["params"] == plain["params"]
    assert held["optim"] == plain["optim"] + 2 * plain["params"]
