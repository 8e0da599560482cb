"""A preemption notice on a two-node local Ray cluster: the second node of an elastic
tp=2 x dp=2 job is drained with a 20 s deadline, as an autoscaler or a spot handler does
(`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION`). The job checkpoints before the
deadline, goes on without the node and succeeds, losing no step, with the losses of an
uninterrupted run and every step recorded once."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import pytest
import ray

from shardline.service.local_nodes import drain_for_preemption
from shardline.service.ray_runtime import HEAD_RESOURCE
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from tests.e2e.conftest import wait_for
from tests.e2e.test_elastic import (
    BODY as ELASTIC_BODY,
)
from tests.e2e.test_elastic import job_on_two_nodes, messages, wait_for_event

log = logging.getLogger(__name__)

STEPS = 40
LIMIT_S = 400.0
DEADLINE_S = 20
# Snapshots every 2 steps and no disk checkpoint: whatever is not saved at the notice is
# lost with the node (its ranks' snapshots live there).
BODY: dict[str, Any] = {
    **ELASTIC_BODY,
    "name": "e2e-preempt",
    "train": {**ELASTIC_BODY["train"], "steps": STEPS},
    "checkpoint": {"memory_every_steps": 2},
}


def head_node_id() -> str:
    return next(n["NodeID"] for n in ray.nodes() if HEAD_RESOURCE in n["Resources"])


def test_a_preempted_node_is_left_before_its_deadline_losing_no_step(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    alone = {**BODY, "parallel": {"dp": 1}, "fault_tolerance": {"max_failures": 0}}
    reference: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(alone), 1, on_metrics=reference.append)
    with job_on_two_nodes(tmp_path, monkeypatch, BODY, at_step=4) as (_, head, c, second, job):
        placed = next(e for e in c.events(job["id"]) if e["data"].get("kind") == "placement")
        # The head is the node that stays (a driver on a host with two nodes may be on
        # either, so not this process's node).
        (other,) = [n for n in placed["data"]["nodes"] if n != head_node_id()]
        drain_for_preemption(head, other, DEADLINE_S)
        told = time.monotonic()
        wait_for_event(c, job["id"], "placement group ready: 2 ranks on 1 node(s)")
        moved_s = time.monotonic() - told
        second.kill()  # the deadline: the provider takes the node
        done = wait_for(c, job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), LIMIT_S)
        metrics = c.metrics(job["id"])
        events = messages(c, job["id"])
        timeline = [(e["data"] or {}) | {"message": e["message"]} for e in c.events(job["id"])]

    assert done["state"] == "SUCCEEDED", events
    assert moved_s < DEADLINE_S, (moved_s, events)
    notice = next(e for e in timeline if e.get("kind") == "preemption")
    assert notice["nodes"] == [other] and 0 < notice["deadline_s"][other] <= DEADLINE_S, notice
    # It saved where it stopped and went on from there: nothing trained twice.
    (recovery,) = [e for e in timeline if e.get("kind") == "recovery"]
    assert recovery["steps_lost"] == 0, recovery
    # The figures in docs/benchmarks.md (shown with --log-cli-level=INFO).
    log.info(
        "preemption: notice to placed without the node %.2f s, notice to the next new step "
        "%.2f s, checkpoint of step %d",
        moved_s,
        recovery["mttr_s"],
        recovery["restored_step"],
    )
    assert recovery["cause"].startswith(f"a preemption notice for node {other}"), recovery
    assert (done["steps_lost"], done["failures"], done["restarts"]) == (0, 0, 1), done
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), events
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4), f"step {got['step']}"
