"""Recovery in the supervisor, through the `Workers` protocol with a fake group: a backoff
that a cancel or a pause cuts short, rolling back past a non-finite loss, what a recovery
event tells, and injecting faults."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardline.workers.runtime.supervisor.machine as supervisor_module
from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import EventEntry, MetricsEntry, StateEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import NonFiniteStep, WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.runtime.supervisor.workers import FaultRefused
from shardline.workers.storage.layout import JobLayout
from shardline.workers.storage.skipped_batches import SkippedBatches


def status(rank: int, phase: WorkerPhase, step: int, **extra: Any) -> WorkerStatus:
    summary = {"final_loss": 1.0} if phase == WorkerPhase.DONE else None
    fields: dict[str, Any] = {"last_progress": time.time(), "summary": summary, **extra}
    return WorkerStatus(rank=rank, phase=phase, step=step, loss=1.0, **fields)


def nonfinite(rank: int, step: int, batch: int) -> WorkerStatus:
    bad = NonFiniteStep(step=step, batch=batch, loss=float("nan"))
    return status(rank, WorkerPhase.FAILED, step - 1, error="NonFiniteLoss: ...", nonfinite=bad)


class ScriptedWorkers:
    """Each start of the workers plays the next script: a list of polls, the last one
    repeated. Records what the supervisor asked for."""

    warm_start = False
    pooled_ranks = 0

    def __init__(self, scripts: list[list[list[WorkerStatus]]]) -> None:
        self.scripts = scripts
        self.script: list[list[WorkerStatus]] = []
        self.calls: list[str] = []
        self.stopping = False

    def reserve(self, timeout_s: float) -> list[str]:
        self.calls.append("reserve")
        return ["node-a", "node-b"]

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        self.calls.append("start")
        self.script = list(self.scripts.pop(0)) if self.scripts else []

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        if self.stopping:
            return [status(0, WorkerPhase.STOPPED, 3), status(1, WorkerPhase.STOPPED, 3)]
        return self.script.pop(0) if len(self.script) > 1 else self.script[0]

    def request_stop(self, save: bool = False) -> None:
        self.calls.append("stop")
        self.stopping = True

    def kill_workers(self) -> None:
        self.calls.append("kill")

    def release(self) -> None:
        self.calls.append("release")

    def inject_fault(self, rank: int, kind: str) -> None:
        self.calls.append(f"fault {kind} {rank}")

    def profile(self, profile_id: str, steps: int) -> int:
        self.calls.append(f"profile {profile_id} {steps}")
        return 2


def make(tmp_path: Path, workers: ScriptedWorkers, **ft: Any) -> JobSupervisor:
    spec = JobSpec.model_validate({"name": "s", "parallel": {"dp": 2}, "fault_tolerance": ft})
    return JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)


def events(sup: JobSupervisor) -> list[EventEntry]:
    return [e for e in sup.buffer.after(0) if isinstance(e, EventEntry)]


def states(sup: JobSupervisor) -> list[str]:
    return [e.state for e in sup.buffer.after(0) if isinstance(e, StateEntry)]


@pytest.fixture(autouse=True)
def quick_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "POLL_INTERVAL_S", 0.01)


def boom() -> list[WorkerStatus]:
    return [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 3, error="boom")]


def training() -> list[WorkerStatus]:
    # Made when the test runs: a status made at import would look hung to a supervisor
    # whose test runs more than hang_timeout_s after collection (as in the full suite).
    return [status(0, WorkerPhase.TRAINING, 5), status(1, WorkerPhase.TRAINING, 5)]


@pytest.mark.parametrize("interrupt", ["cancel", "pause"])
def test_a_cancel_or_pause_does_not_wait_out_the_backoff(tmp_path: Path, interrupt: str) -> None:
    # Rank 1 lost, and nothing says its node lives: the first failure waits the base
    # backoff (a node may be gone), set far longer than this test may take.
    lost = [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 3, lost=True)]
    workers = ScriptedWorkers([[lost], [training()]])
    sup = make(tmp_path, workers, max_failures=5)
    sup.handling.policy.base_backoff_s = 120.0
    runner = threading.Thread(target=sup.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while "kill" not in workers.calls:  # the failure was seen: the backoff has begun
        assert time.monotonic() < deadline, workers.calls
        time.sleep(0.01)
    asked = time.monotonic()
    getattr(sup, interrupt)()
    # PAUSED is not terminal (the reconciler removes a paused supervisor): wait for it.
    want = JobState.CANCELLED if interrupt == "cancel" else JobState.PAUSED
    while sup.state != want and time.monotonic() < asked + 60:
        time.sleep(0.01)
    took = time.monotonic() - asked
    assert sup.state == want, states(sup)
    assert took < 10, took  # not the 120 s backoff


def test_a_nonfinite_loss_rolls_back_skips_the_batch_and_finishes(tmp_path: Path) -> None:
    done = [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]
    workers = ScriptedWorkers([[[nonfinite(0, 6, 6), nonfinite(1, 6, 6)]], [training(), done]])
    sup = make(tmp_path, workers, max_failures=0, max_nonfinite_skips=2)
    assert sup.run() == JobState.SUCCEEDED
    assert states(sup) == ["RUNNING", "RESTARTING", "RUNNING", "SUCCEEDED"]
    # Rolled back on fresh workers, with no failure counted (max_failures is 0).
    assert workers.calls == ["reserve", "start", "kill", "reserve", "start", "release"]
    assert sup.failures == 0
    assert SkippedBatches(sup.layout.checkpoints_dir).read() == [{"step": 6, "batch": 6}]
    said = next(e for e in events(sup) if e.message.startswith("non-finite loss"))
    assert said.data == {"step": 6, "batch": 6, "skipped": True, "kind": "nonfinite"}
    assert "skipping batch 6" in said.message
    recovered = next(e for e in events(sup) if e.message.startswith("recovered"))
    assert recovered.data["skipped"] == {"step": 6, "batch": 6}
    assert recovered.data["cause"] == "a non-finite loss at step 6"
    assert recovered.data["ranks"] == [0, 1]


def test_a_nonfinite_loss_at_the_same_step_again_fails_at_once(tmp_path: Path) -> None:
    bad = [[nonfinite(0, 6, 6), nonfinite(1, 6, 6)]]
    again = [[nonfinite(0, 6, 7), nonfinite(1, 6, 7)]]
    workers = ScriptedWorkers([bad, again])
    sup = make(tmp_path, workers, max_failures=5, max_nonfinite_skips=5)
    assert sup.run() == JobState.FAILED
    final = [e for e in sup.buffer.after(0) if isinstance(e, StateEntry)][-1]
    assert "step 6 is not finite (nan) again after rolling back" in final.reason
    assert workers.calls.count("start") == 2  # failed at once: no third start


def test_past_max_nonfinite_skips_the_job_fails_naming_the_limit(tmp_path: Path) -> None:
    workers = ScriptedWorkers([[[nonfinite(0, 3, 3), nonfinite(1, 3, 3)]]])
    sup = make(tmp_path, workers, max_nonfinite_skips=0)
    assert sup.run() == JobState.FAILED
    final = [e for e in sup.buffer.after(0) if isinstance(e, StateEntry)][-1]
    assert "max_nonfinite_skips=0" in final.reason and "step 3" in final.reason
    assert workers.calls == ["reserve", "start", "kill", "release"]


def test_a_recovery_event_names_cause_ranks_nodes_snapshot_and_cost(tmp_path: Path) -> None:
    metrics = [{"step": 4, "loss": 1.0, "step_time_s": 2.0}]
    before = [
        status(0, WorkerPhase.TRAINING, 4, metrics=metrics),
        status(1, WorkerPhase.TRAINING, 4),
    ]
    restored = Event(EventKind.RESTORED, "restored checkpoint step 2", {"step": 2})
    after = [
        status(0, WorkerPhase.TRAINING, 3, events=[restored]),
        status(1, WorkerPhase.TRAINING, 3),
    ]
    done = [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]
    workers = ScriptedWorkers([[before, boom()], [after, done]])
    sup = make(tmp_path, workers, max_failures=1)
    sup.handling.policy.base_backoff_s = 0.0
    assert sup.run() == JobState.SUCCEEDED
    rec = next(e for e in events(sup) if e.message.startswith("recovered")).data
    assert rec["cause"] == "rank 1: boom"
    assert rec["ranks"] == [1] and rec["nodes"] == ["node-b"]
    assert rec["restored_step"] == 2 and rec["front_step"] == 4 and rec["steps_lost"] == 2
    # The time to recover plus the two lost steps at the last step time seen (2 s each).
    assert rec["seconds_lost"] == pytest.approx(rec["mttr_s"] + 4.0)


def test_a_hang_names_the_ranks_behind_and_where_each_stood(tmp_path: Path) -> None:
    stale = time.time() - 50
    hung = [
        status(0, WorkerPhase.TRAINING, 7, last_progress=stale + 5),
        status(1, WorkerPhase.TRAINING, 6, last_progress=stale),
    ]
    done = [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]
    training = [status(0, WorkerPhase.TRAINING, 8), status(1, WorkerPhase.TRAINING, 8)]
    workers = ScriptedWorkers([[hung], [training, done]])
    sup = make(tmp_path, workers, hang_timeout_s=10, max_failures=1)
    sup.handling.policy.base_backoff_s = 0.0
    assert sup.run() == JobState.SUCCEEDED
    failure = next(e for e in events(sup) if e.message.startswith("failure"))
    assert "rank 1 at step 6; the front at step 7" in failure.message
    rec = next(e for e in events(sup) if e.message.startswith("recovered")).data
    assert rec["ranks"] == [1] and rec["nodes"] == ["node-b"]
    assert rec["rank_steps"] == {0: 7, 1: 6}
    # Counted from when rank 1 stalled (50 s ago), not from when the hang was noticed.
    assert rec["mttr_s"] >= 50


def test_a_fault_goes_to_the_rank_of_a_running_job_and_is_named_in_the_recovery(
    tmp_path: Path,
) -> None:
    workers = ScriptedWorkers([[training()]])
    sup = make(tmp_path, workers)
    with pytest.raises(FaultRefused, match="STARTING"):
        sup.inject_fault("kill", 1)
    sup._enter(sup.step())  # launch: RUNNING
    sup.inject_fault("raise", 1)
    assert workers.calls[-1] == "fault raise 1"
    assert events(sup)[-1].message == "fault injected: raise on rank 1"
    sup.inject_fault("nan", 0)  # injected later, but rank 0 fails not: not the recovery's
    with pytest.raises(ValueError):
        sup.inject_fault("explode", 0)
    workers.script = [boom()]
    sup._enter(sup.step())
    assert sup.state == JobState.RESTARTING
    recovery = sup.recoveries.current
    assert recovery is not None and recovery.injected == "raise on rank 1"
    sup.cancel()
    with pytest.raises(FaultRefused):
        sup.inject_fault("kill", 0)


def test_a_profile_goes_to_every_rank_of_a_running_job_only(tmp_path: Path) -> None:
    workers = ScriptedWorkers([[training()]])
    sup = make(tmp_path, workers)
    with pytest.raises(FaultRefused, match="STARTING"):
        sup.profile("p1", 3)
    sup._enter(sup.step())  # launch: RUNNING
    assert sup.profile("p1", 3) == 2  # the ranks asked
    assert workers.calls[-1] == "profile p1 3"
    said = events(sup)[-1]
    assert said.message == "profile p1: recording the next 3 steps of 2 rank(s)"
    assert said.data["profile"] == "p1" and said.data["ranks"] == 2
    sup.pause()
    with pytest.raises(FaultRefused):
        sup.profile("p2", 3)


def test_a_job_that_finished_training_refuses_faults_and_profiles_as_finished(
    tmp_path: Path,
) -> None:
    """Between its ranks' end and SUCCEEDED a job is still RUNNING, its workers released:
    asked then, it says it finished, not that its workers are being replaced."""
    done = [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]
    workers = ScriptedWorkers([[training(), done]])
    sup = make(tmp_path, workers)
    sup._enter(sup.step())  # launch: RUNNING
    sup._enter(sup.step())  # training
    finishing = sup.step()  # the ranks are done; the supervisor has not said SUCCEEDED yet
    assert sup.state == JobState.RUNNING and finishing.state == JobState.SUCCEEDED
    with pytest.raises(FaultRefused, match="finished training"):
        sup.inject_fault("kill", 0)
    with pytest.raises(FaultRefused, match="finished training"):
        sup.profile("p1", 3)


def test_a_dead_rank_is_named_rather_than_the_peers_its_death_broke(tmp_path: Path) -> None:
    dead = status(1, WorkerPhase.FAILED, 4, error="its actor died: ActorDiedError", lost=True)
    broken = status(0, WorkerPhase.FAILED, 4, error="RuntimeError: Connection reset by peer")
    done = [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]
    workers = ScriptedWorkers([[[broken, dead]], [training(), done]])
    sup = make(tmp_path, workers, max_failures=1)
    sup.handling.policy.base_backoff_s = 0.0
    assert sup.run() == JobState.SUCCEEDED
    rec = next(e for e in events(sup) if e.message.startswith("recovered")).data
    assert rec["ranks"] == [1] and rec["nodes"] == ["node-b"]
    assert "Connection reset" in rec["cause"] and "its actor died" in rec["cause"]


class LoggingWorkers(ScriptedWorkers):
    """Rank 0 appends every step it logs to the job's metrics file, as a worker does."""

    def __init__(self, scripts: list[list[list[WorkerStatus]]], metrics_file: Path) -> None:
        super().__init__(scripts)
        self.metrics_file = metrics_file
        self.logged: list[dict[str, Any]] = []

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        statuses = super().poll(timeout_s)
        with self.metrics_file.open("a") as out:
            for step in range(len(self.logged) + 1, statuses[0].step + 1):
                self.logged.append({"step": step, "loss": 1.0})
                out.write(json.dumps(self.logged[-1]) + "\n")
        return statuses


def test_steps_whose_poll_was_lost_are_taken_from_the_metrics_file(tmp_path: Path) -> None:
    # Rank 0 logged step 3 to the job's metrics file, but the poll that carried it never
    # arrived (a rank 0 killed or abandoned mid-poll): the gap is filled from the file.
    sent = [{"step": s, "loss": 1.0} for s in (1, 2, 3, 4)]
    first = [
        status(0, WorkerPhase.TRAINING, 2, metrics=sent[:2]),
        status(1, WorkerPhase.TRAINING, 2),
    ]
    later = [
        status(0, WorkerPhase.TRAINING, 4, metrics=sent[3:]),
        status(1, WorkerPhase.TRAINING, 4),
    ]
    done = [status(0, WorkerPhase.DONE, 4), status(1, WorkerPhase.DONE, 4)]
    spec = JobSpec.model_validate({"name": "s", "parallel": {"dp": 2}})
    workers = LoggingWorkers([[first, later, done]], tmp_path / "job1" / "metrics.jsonl")
    sup = JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)
    assert sup.run() == JobState.SUCCEEDED
    steps = [e.step for e in sup.buffer.after(0) if isinstance(e, MetricsEntry)]
    assert steps == [1, 2, 3, 4]


class PlacedScriptedWorkers(ScriptedWorkers):
    """Scripted workers that say where each rank runs (ranks 0 and 1 on `nodes`)."""

    def __init__(self, scripts: list[list[list[WorkerStatus]]], nodes: list[str]) -> None:
        super().__init__(scripts)
        self.nodes = nodes

    def node_of(self, ranks: list[int]) -> list[str]:
        return [self.nodes[r] for r in ranks]

    def exclude_nodes(self, nodes: set[str]) -> set[str]:
        return set()


@pytest.mark.parametrize(
    ("nodes", "says"),
    [(["node-a", "node-a"], "restarting at once"), (["node-a", "node-b"], "restarting in 1s")],
    ids=["beside-a-live-rank", "alone-on-its-node"],
)
def test_a_lost_rank_beside_one_that_answers_is_restarted_at_once(
    tmp_path: Path, nodes: list[str], says: str
) -> None:
    lost = [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 3, lost=True)]
    workers = PlacedScriptedWorkers([[lost], [training()]], nodes)
    sup = make(tmp_path, workers, max_failures=5)
    sup.handling.policy.base_backoff_s = 1.0
    runner = threading.Thread(target=sup.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while not any(e.message.startswith("failure:") for e in events(sup)):
        assert time.monotonic() < deadline, workers.calls
        time.sleep(0.01)
    sup.cancel()
    runner.join(timeout=30)
    failure = next(e.message for e in events(sup) if e.message.startswith("failure:"))
    assert says in failure, failure


def test_a_failure_after_new_steps_is_no_crash_loop_however_soon_it_comes(
    tmp_path: Path,
) -> None:
    """Rank 1 lost three times within a second: after the first restart the job trained
    new steps, so the second failure restarts at once too; the third comes before the
    next world trained anything, and that is a crash loop."""

    def lost() -> list[WorkerStatus]:
        return [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 3, lost=True)]

    def trained() -> list[WorkerStatus]:
        return [status(0, WorkerPhase.TRAINING, 6), status(1, WorkerPhase.TRAINING, 6)]

    def lost_before_a_step() -> list[WorkerStatus]:
        return [status(0, WorkerPhase.JOINING, 0), status(1, WorkerPhase.FAILED, 0, lost=True)]

    workers = PlacedScriptedWorkers(
        [[lost()], [trained(), lost()], [lost_before_a_step()], [training()]],
        ["node-a", "node-a"],
    )
    sup = make(tmp_path, workers, max_failures=5)
    runner = threading.Thread(target=sup.run, daemon=True)
    runner.start()
    deadline = time.monotonic() + 30
    while len([e for e in events(sup) if e.message.startswith("failure:")]) < 3:
        assert time.monotonic() < deadline, [e.message for e in events(sup)]
        time.sleep(0.01)
    sup.cancel()  # cuts the crash loop's wait short
    runner.join(timeout=30)
    failures = [e.message for e in events(sup) if e.message.startswith("failure:")]
    assert "restarting at once" in failures[0] and "restarting at once" in failures[1], failures
    assert "restarting in 2s (a crash loop)" in failures[2], failures
