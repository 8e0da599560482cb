"""Node loss on a two-node local Ray cluster: an elastic tp=2 x dp=2 job whose second
node is killed is planned again on the 2 ranks left, in a layout that changes more than
dp (the planner's fastest there), with the same global batch, then grows back to tp=2 x
dp=2 when a node returns; the losses stay those of an uninterrupted run and each step is
recorded once."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import pytest
import ray

from shardline.api.client import Client
from shardline.service.local_nodes import FAST_NODE_DEATH, LocalNode, start_local_node
from shardline.service.local_ray import LocalRay, start_local_ray
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from shardline.workers.storage.snapshots import ROOT_ENV
from tests.e2e.conftest import Service, new_service, wait_for
from tests.support.databases import fresh_database
from tests.support.ray_head import attached

# The job loses a node after step 6 and grows back after a few steps on 2 ranks; the
# rest run on 4 ranks (0.3-0.5 s a step here).
STEPS = 100
LIMIT_S = 400.0  # generous: a loaded 2-core machine is slow
CPUS_PER_NODE = 2  # logical: a 4-rank job spreads two ranks (one tp group) on each node

BODY: dict[str, Any] = {
    "name": "e2e-elastic",
    "model": {"preset": "tiny", "seq_len": 64},
    "parallel": {"dp": 2, "tp": 2},
    "train": {
        "steps": STEPS,
        "global_batch_size": 8,
        "micro_batch_size": 4,
        # Modest, so the loss stays well above 0 and a relative comparison means something.
        "lr": 1e-3,
        "log_every": 1,
        "seed": 5,
    },
    "checkpoint": {"every_steps": 10, "memory_every_steps": 2},
    "fault_tolerance": {"max_failures": 3, "hang_timeout_s": 8, "elastic": {"min_dp": 1}},
}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    """The uninterrupted run, in one process: every layout trains like one process (to
    about 1e-6 here), and one process is 5 times faster than tp=2 x dp=2 on this CPU."""
    alone = {**BODY, "parallel": {"dp": 1}, "fault_tolerance": {"max_failures": 0}}
    metrics: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(alone), 1, on_metrics=metrics.append)
    return metrics


@contextmanager
def ray_node(head: LocalRay, folder: Path, name: str, ip: str) -> Iterator[LocalNode]:
    """A second Ray node on this machine, at its own address with its own host memory."""
    node = start_local_node(head, folder, name, ip, CPUS_PER_NODE)
    try:
        yield node
    finally:
        node.kill()


def wait_for_cpus(c: Client, cpus: float) -> None:
    deadline = time.monotonic() + 120
    while c.cluster()["resources"].get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, c.cluster()
        time.sleep(0.5)


@contextmanager
def two_node_service(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Service, LocalRay]]:
    # The head node keeps its snapshots in this machine's /dev/shm; the service must not
    # name a snapshot root (SHARDLINE_SNAPSHOT_ROOT), which would be every node's.
    monkeypatch.delenv(ROOT_ENV, raising=False)
    for name, value in FAST_NODE_DEATH.items():  # a lost node is dead after about 3 s
        monkeypatch.setenv(name, value)
    if ray.is_initialized():  # this process may be connected to the tier's own head
        ray.shutdown()
    with ExitStack() as stack:
        # Not the embedded head's loopback-only mode, which refuses other nodes.
        head = start_local_ray(tmp_path / "ray-state", CPUS_PER_NODE, loopback=False)
        stack.callback(head.stop)
        # Attached for this test only: the tier's own head must be reachable after it.
        stack.enter_context(attached(head))
        url = stack.enter_context(fresh_database("sqlite", tmp_path))
        yield new_service(url, head.address, tmp_path), head


@contextmanager
def job_on_two_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, body: dict[str, Any], at_step: int
) -> Iterator[tuple[ExitStack, LocalRay, Client, LocalNode, dict[str, Any]]]:
    """`body` submitted to a service over two Ray nodes and trained past `at_step`: the
    stack that holds it all, the head, a client, the second node's session and the job."""
    with ExitStack() as stack:
        svc, head = stack.enter_context(two_node_service(tmp_path, monkeypatch))
        server = stack.enter_context(svc.running())
        c = stack.enter_context(svc.client(server))
        second = stack.enter_context(ray_node(head, tmp_path, "node2", "127.0.0.2"))
        wait_for_cpus(c, 2 * CPUS_PER_NODE)
        job = c.submit(body)
        wait_for(c, job["id"], lambda j: j["step"] >= at_step, LIMIT_S)
        yield stack, head, c, second, job


def messages(c: Client, job_id: str) -> list[str]:
    return [e["message"] for e in c.events(job_id, after=0)]


def wait_for_event(c: Client, job_id: str, prefix: str) -> None:
    deadline = time.monotonic() + LIMIT_S
    while not any(m.startswith(prefix) for m in messages(c, job_id)):
        state = c.get(job_id)["state"]
        assert state not in ("SUCCEEDED", "FAILED", "CANCELLED"), (state, messages(c, job_id))
        assert time.monotonic() < deadline, messages(c, job_id)
        time.sleep(0.5)


def test_node_lost_elastic_job_is_re_planned_on_half_and_grows_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, reference: list[dict[str, Any]]
) -> None:
    with job_on_two_nodes(tmp_path, monkeypatch, BODY, at_step=6) as (stack, head, c, second, job):
        assert "placement group ready: 4 ranks on 2 node(s)" in messages(c, job["id"])
        second.kill()
        wait_for_event(c, job["id"], "elastic re-plan: dp=2 tp=2 pp=1 (4 ranks)")
        # A node returns as soon as the job has re-planned: its steps on 2 ranks are fast
        # (0.06 s here, about 6 s for the rest of the run) and a node takes seconds to
        # join, so a later start found the job done on CI once. It grows only once it has
        # trained re-planned (the timeline's checks below), so the shrunk layout trains.
        stack.enter_context(ray_node(head, tmp_path, "node3", "127.0.0.3"))
        wait_for_event(c, job["id"], "placement group ready: 2 ranks on 1 node(s)")
        wait_for_event(c, job["id"], "elastic: capacity is back")
        done = wait_for(c, job["id"], lambda j: j["state"] == "SUCCEEDED", LIMIT_S)
        metrics = c.metrics(job["id"])
        events = messages(c, job["id"])
        timeline = [(e["data"] or {}) | {"message": e["message"]} for e in c.events(job["id"])]
    assert done["state"] == "SUCCEEDED"
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)), events
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-4), f"step {got['step']}"
    # The last placement is at full size again, over both nodes.
    placements = [e for e in events if e.startswith("placement group ready")]
    spread = next(e for e in timeline if e.get("kind") == "snapshot_memory")
    assert len(spread["folders"]) == 2, spread  # a folder of host memory on each node
    assert placements[-1] == "placement group ready: 4 ranks on 2 node(s)", events
    assert_resumed_after_shrink_and_growth(timeline)
    # The node went, with its host memory, before any disk checkpoint: the copy of its
    # snapshot on the node left (every 2 steps) cost at most 2 steps trained again.
    lost = next(e for e in timeline if e.get("kind") == "recovery")
    assert lost["restored_tier"] == "memory" and lost["steps_lost"] <= 2, (lost, events)
    replans = [e for e in timeline if e.get("kind") == "elastic" and "to" in e]
    assert replans, events
    before, after = replans[0]["from"], replans[0]["to"]
    assert (before["dp"], before["tp"], before["pp"]) == (2, 2, 1), events
    # More than dp changed: the planner's layout on 2 ranks, not tp=2 x dp=1.
    assert after["dp"] * after["tp"] * after["pp"] == 2, events
    assert (after["tp"], after["pp"]) != (2, 1), events


def assert_resumed_after_shrink_and_growth(timeline: list[dict[str, Any]]) -> None:
    """Each restart resumed, never from step 0: the shrink from a checkpoint or snapshot
    taken before the node was lost, the grow-back from the checkpoint it saved to grow."""
    said = "\n".join(e["message"] for e in timeline)
    kinds = [e.get("kind") for e in timeline]
    restores = [e for e in timeline if e.get("kind") == "restored"]
    assert len(restores) == 2, said
    shrink, growth = restores
    assert shrink["step"] > 0, said
    back = next(
        i for i, e in enumerate(timeline) if e["message"].startswith("elastic: capacity is back")
    )
    saved = [e for e in timeline[:back] if e.get("kind") == "checkpoint_committed"]
    assert saved and growth["step"] == saved[-1]["step"] > shrink["step"], said
    assert kinds.index("restored", back) > back, said
