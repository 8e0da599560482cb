"""Preemption notices in the supervisor, through the `Workers` protocol with a scripted
group: a draining node of the job is noticed once, the ranks checkpoint and stop, the
node is left out and the job goes on from that checkpoint, with no failure counted."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import shardline.workers.runtime.supervisor.machine as supervisor_module
from shardline.workers.contract.events import EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.placement.preemption import PreemptionWatch
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from tests.unit.test_supervisor_recovery import ScriptedWorkers, events, make, states, status


class PlacedScriptedWorkers(ScriptedWorkers):
    """Ranks 0 and 1 on node-a and node-b; records the nodes left out."""

    def __init__(self, scripts: list[list[list[WorkerStatus]]]) -> None:
        super().__init__(scripts)
        self.excluded: set[str] = set()

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        super().start(join_timeout_s, cancelled)
        self.stopping = False  # new workers: the last ones' stop is not theirs

    def request_stop(self, save: bool = False) -> None:
        self.calls.append(f"stop save={save}")
        self.stopping = True

    def node_of(self, ranks: list[int]) -> list[str]:
        return [["node-a", "node-b"][r] for r in ranks]

    def exclude_nodes(self, nodes: set[str]) -> set[str]:
        self.calls.append(f"exclude {sorted(nodes)}")
        self.excluded |= nodes
        return nodes


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "POLL_INTERVAL_S", 0.01)


def training(step: int) -> list[WorkerStatus]:
    return [status(0, WorkerPhase.TRAINING, step), status(1, WorkerPhase.TRAINING, step)]


def done() -> list[WorkerStatus]:
    return [status(0, WorkerPhase.DONE, 9), status(1, WorkerPhase.DONE, 9)]


def supervisor(
    tmp_path: Path, workers: PlacedScriptedWorkers, drains: dict[str, int]
) -> JobSupervisor:
    sup = make(tmp_path, workers, max_failures=0)
    sup.preemptions.watch = PreemptionWatch(draining=lambda: drains, check_every_s=0.0)
    return sup


def test_a_draining_node_is_left_after_a_checkpoint_with_no_failure_counted(
    tmp_path: Path,
) -> None:
    # Left alone, the first workers would finish: only the notice makes them move.
    workers = PlacedScriptedWorkers([[training(3), training(3), done()], [training(4), done()]])
    deadline_ms = int((time.time() + 20) * 1000)
    # A drain of a node the job does not use is none of its business.
    sup = supervisor(tmp_path, workers, {"node-b": deadline_ms, "node-z": deadline_ms})
    assert sup.run() == JobState.SUCCEEDED
    assert states(sup) == ["RUNNING", "RESTARTING", "RUNNING", "SUCCEEDED"]
    # Checkpoint and stop first, then take the workers down and leave the node out.
    stop = workers.calls.index("stop save=True")
    assert workers.calls[stop + 1 : stop + 3] == ["kill", "exclude ['node-b']"], workers.calls
    assert workers.calls.count("stop save=True") == 1  # noticed once, not at every look
    assert sup.failures == 0  # max_failures is 0: a counted failure would have failed it
    notice = next(e for e in events(sup) if e.data.get("kind") == EventKind.PREEMPTION)
    assert notice.data["nodes"] == ["node-b"]
    assert 15 <= notice.data["deadline_s"]["node-b"] <= 20
    assert "node node-b" in notice.message and "s left" in notice.message
    recovered = next(e for e in events(sup) if e.data.get("kind") == EventKind.RECOVERY)
    assert recovered.data["cause"].startswith("a preemption notice for node node-b")
    assert recovered.data["ranks"] == [1]


def test_without_a_drain_nothing_moves(tmp_path: Path) -> None:
    workers = PlacedScriptedWorkers([[training(3), training(4), done()]])
    sup = supervisor(tmp_path, workers, {})
    assert sup.run() == JobState.SUCCEEDED
    assert not [c for c in workers.calls if c.startswith(("stop", "exclude"))], workers.calls


def test_the_watch_says_once_per_node_and_survives_a_failed_look() -> None:
    now = 1000.0
    drains: dict[str, int] = {"a": int((now + 30) * 1000), "b": 0}
    looks: Iterator[dict[str, int] | Exception] = iter(
        [drains, RuntimeError("gcs"), {**drains, "c": 1}]
    )

    def source() -> dict[str, int]:
        got = next(looks)
        if isinstance(got, Exception):
            raise got
        return got

    watch = PreemptionWatch(draining=source, check_every_s=0.0, clock=lambda: now)
    first = watch.check(["a", "b", "c"])
    assert first is not None and first.seconds_left == {"a": 30.0, "b": math.inf}
    assert first.first_deadline_s == 30.0
    assert watch.check(["a", "b", "c"]) is None  # the look failed: no notice, no raise
    third = watch.check(["a", "b", "c"])
    assert third is not None and third.nodes == {"c"}  # a and b were said already
    assert third.seconds_left["c"] == 0.0  # its deadline passed: no time left


class SlowSavingWorkers(PlacedScriptedWorkers):
    """Ranks whose checkpoint outlasts any deadline: asked to stop, they go on training
    until they are killed. Records when each call came."""

    def __init__(self, scripts: list[list[list[WorkerStatus]]]) -> None:
        super().__init__(scripts)
        self.at: dict[str, float] = {}

    def request_stop(self, save: bool = False) -> None:
        super().request_stop(save)
        self.at.setdefault("stop", time.monotonic())
        self.stopping = False  # still saving: their polls say training

    def kill_workers(self) -> None:
        super().kill_workers()
        self.at.setdefault("kill", time.monotonic())


def test_ranks_still_saving_at_the_node_s_deadline_are_stopped_then(tmp_path: Path) -> None:
    """The grace is the node's deadline, not the longest the supervisor would ever wait:
    a checkpoint still running when the node goes is cut off then (the one before it is
    restored), and the job goes on without the node."""
    workers = SlowSavingWorkers([[training(3)], [training(4), done()]])
    deadline_s = 7.0
    sup = supervisor(tmp_path, workers, {"node-b": int((time.time() + deadline_s) * 1000)})
    ended: list[JobState] = []
    runner = threading.Thread(target=lambda: ended.append(sup.run()), daemon=True)
    runner.start()
    runner.join(timeout=deadline_s + 15)
    assert not runner.is_alive(), f"still waiting {deadline_s + 15} s after a {deadline_s} s notice"
    assert ended == [JobState.SUCCEEDED]
    waited = workers.at["kill"] - workers.at["stop"]
    assert deadline_s - 3 <= waited <= deadline_s + 1, waited
    assert "exclude ['node-b']" in workers.calls
