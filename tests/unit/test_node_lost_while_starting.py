"""A restart onto a node that died before Ray said so: the start gives up as soon as Ray
marks the node dead, and the supervisor places the job again, counting no failure."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.status import WorkerPhase
from shardline.workers.runtime.joining import wait_for_start
from shardline.workers.runtime.supervisor.workers import NodeLost
from tests.unit.test_supervisor_recovery import (
    ScriptedWorkers,
    events,
    make,
    quick_polls,  # noqa: F401  (a fixture)
    status,
    training,
)


def test_a_start_stops_waiting_once_a_node_of_the_placement_is_dead() -> None:
    with pytest.raises(NodeLost):
        wait_for_start([object()], time.monotonic() + 300, lambda: False, lambda: True)


class NodeDiesOnce(ScriptedWorkers):
    """Its first start finds a node of the placement dead."""

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        if "start" not in self.calls:
            self.calls.append("start")
            raise NodeLost(["deadbeef" * 7])
        super().start(join_timeout_s, cancelled)


def test_the_job_is_placed_again_and_no_failure_is_counted(tmp_path: Path) -> None:
    done = [status(0, WorkerPhase.DONE, 6), status(1, WorkerPhase.DONE, 6)]
    workers = NodeDiesOnce([[training(), done]])
    sup = make(tmp_path, workers, max_failures=0)
    assert sup.run() == JobState.SUCCEEDED
    assert workers.calls[:4] == ["reserve", "start", "reserve", "start"], workers.calls
    said = [e.message for e in events(sup)]
    assert any(m.startswith("node(s) deadbeef of the placement died") for m in said), said
    assert sup.handling.failures == 0


def test_an_actor_that_died_with_its_node_is_a_lost_node_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import ray

    import shardline.workers.runtime.joining as joining

    def died(refs: object) -> None:
        raise ray.exceptions.RayActorError()

    monkeypatch.setattr(joining.ray, "wait", lambda pending, **_: (pending, []))
    monkeypatch.setattr(joining.ray, "get", died)
    checks = iter([False, True])  # Ray marks the node dead just after the actor's death
    with pytest.raises(NodeLost):
        wait_for_start([object()], time.monotonic() + 300, lambda: False, lambda: next(checks))
    alive = iter([False, False])  # an actor that died on a live node: a failure
    with pytest.raises(ray.exceptions.RayActorError):
        wait_for_start([object()], time.monotonic() + 300, lambda: False, lambda: next(alive))
