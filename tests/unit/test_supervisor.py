"""The supervisor's state machine, driven step by step against a fake worker group."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

import shardline.workers.runtime.supervisor.machine as supervisor_module
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import EventEntry, MetricsEntry, ProgressBuffer, StateEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.decisions import FailurePolicy
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.runtime.supervisor.workers import StartCancelled
from shardline.workers.storage.layout import JobLayout


class FakeWorkers:
    """Scripted polls: each call to poll() returns the next list of statuses."""

    warm_start = False
    pooled_ranks = 0

    def __init__(self, polls: list[list[WorkerStatus]]) -> None:
        self.polls = polls
        self.log: list[str] = []
        self.polls_at: list[int] = []

    def reserve(self, timeout_s: float) -> list[str]:
        self.log.append("reserve")
        return ["node-a", "node-a"]

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        self.log.append("start")

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        # Which start (1st, 2nd, ...) the workers being polled came from.
        self.polls_at.append(self.log.count("start"))
        return self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]

    def request_stop(self, save: bool = False) -> None:
        self.log.append("stop")

    def kill_workers(self) -> None:
        self.log.append("kill")

    def release(self) -> None:
        self.log.append("release")

    def inject_fault(self, rank: int, kind: str) -> None:
        self.log.append(f"fault {kind} {rank}")

    def profile(self, profile_id: str, steps: int) -> int:
        self.log.append(f"profile {profile_id} {steps}")
        return 2


def status(
    rank: int,
    phase: str,
    step: int,
    metrics: list[int] | None = None,
    last_progress: float | None = None,
    error: str | None = None,
) -> WorkerStatus:
    return WorkerStatus(
        rank=rank,
        phase=WorkerPhase(phase),
        step=step,
        loss=1.0,
        last_progress=time.time() if last_progress is None else last_progress,
        error=error,
        metrics=[{"step": s, "loss": 1.0} for s in metrics or []],
        summary={"final_loss": 1.0} if phase == "done" else None,
    )


def make(tmp_path: Path, workers: FakeWorkers, **ft: Any) -> JobSupervisor:
    spec = JobSpec.model_validate(
        {"name": "s", "parallel": {"dp": 2}, "fault_tolerance": {"max_failures": 1, **ft}}
    )
    return JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(supervisor_module, "POLL_INTERVAL_S", 0.0)
    monkeypatch.setattr(FailurePolicy, "decide", _no_backoff(FailurePolicy.decide))


def _no_backoff(decide: Any) -> Any:
    def wrapped(self: FailurePolicy, failures: int, error: str, **kwargs: Any) -> Any:
        d = decide(self, failures, error, **kwargs)
        return type(d)(d.retry, d.reason, 0.0)

    return wrapped


def states(buffer: ProgressBuffer) -> list[str]:
    return [e.state for e in buffer.after(0) if isinstance(e, StateEntry)]


def test_runs_to_success_and_reports_each_metric_once(tmp_path: Path) -> None:
    workers = FakeWorkers(
        [
            [status(0, "training", 1, [1]), status(1, "training", 1)],
            [status(0, "training", 2, [2]), status(1, "training", 2)],
            [status(0, "done", 2), status(1, "done", 2)],
        ]
    )
    sup = make(tmp_path, workers)
    assert sup.run() == JobState.SUCCEEDED
    entries = sup.buffer.after(0)
    assert [e.seq for e in entries] == list(range(1, len(entries) + 1))
    assert [e.step for e in entries if isinstance(e, MetricsEntry)] == [1, 2]
    assert states(sup.buffer) == ["RUNNING", "SUCCEEDED"]
    assert workers.log == ["reserve", "start", "release"]
    assert (tmp_path / "job1" / "spec.json").is_file()
    assert sup.read(len(entries))["entries"] == []


def test_a_failed_rank_restarts_then_gives_up_after_max_failures(tmp_path: Path) -> None:
    boom = [status(0, "training", 1, [1]), status(1, "failed", 0, error="rank 1: boom")]
    workers = FakeWorkers([boom])
    sup = make(tmp_path, workers)
    assert sup.run() == JobState.FAILED
    assert states(sup.buffer) == ["RUNNING", "RESTARTING", "RUNNING", "FAILED"]
    # Each failure tore the workers down; the retry started a fresh set; giving up freed them.
    assert workers.log == ["reserve", "start", "kill", "reserve", "start", "kill", "release"]
    final = [e for e in sup.buffer.after(0) if isinstance(e, StateEntry)][-1]
    assert "rank 1: boom" in final.reason and "max_failures=1" in final.reason
    # Step 1's metrics were sent before the restart and not again after it.
    assert [e.step for e in sup.buffer.after(0) if isinstance(e, MetricsEntry)] == [1]


def test_an_error_of_the_job_itself_fails_at_once_without_a_retry(tmp_path: Path) -> None:
    # A corpus that is not text, a tokenizer that cannot load: the rank says its error is
    # the job's own, and a retry would fail the same way.
    bad = replace(status(1, "failed", 0, error="rank 1: no UTF-8 text found"), deterministic=True)
    workers = FakeWorkers([[status(0, "joining", 0), bad]])
    sup = make(tmp_path, workers, max_failures=3)
    assert sup.run() == JobState.FAILED
    assert states(sup.buffer) == ["RUNNING", "FAILED"]
    assert workers.log == ["reserve", "start", "kill", "release"]
    final = [e for e in sup.buffer.after(0) if isinstance(e, StateEntry)][-1]
    assert "no UTF-8 text found" in final.reason and "not retried" in final.reason
    assert sup.failures == 1


def test_a_restarted_job_runs_on_fresh_workers_to_success(tmp_path: Path) -> None:
    boom = [status(0, "training", 1, [1]), status(1, "failed", 0, error="rank 1: boom")]
    done = [status(0, "done", 2, [2]), status(1, "done", 2)]
    workers = FakeWorkers([boom, done])
    sup = make(tmp_path, workers)
    assert sup.run() == JobState.SUCCEEDED
    assert states(sup.buffer) == ["RUNNING", "RESTARTING", "RUNNING", "SUCCEEDED"]
    # The broken workers were killed before the new ones started, and polled only after.
    assert workers.log == ["reserve", "start", "kill", "reserve", "start", "release"]
    assert workers.polls_at == [1, 2]
    assert sup.failures == 1


def test_a_rank_without_progress_is_named_as_hung(tmp_path: Path) -> None:
    stale = time.time() - 100
    polls = [
        [
            status(0, "training", 5, last_progress=stale),
            status(1, "training", 3, last_progress=stale),
        ]
    ]
    workers = FakeWorkers(polls)
    sup = make(tmp_path, workers, hang_timeout_s=10, max_failures=0)
    assert sup.run() == JobState.FAILED
    assert workers.log == ["reserve", "start", "kill", "release"]
    failure = next(
        e
        for e in sup.buffer.after(0)
        if isinstance(e, EventEntry) and e.message.startswith("failure")
    )
    assert "no progress for 10s on rank(s) [1]" in failure.message


class SlowToJoin(FakeWorkers):
    """A world that takes minutes to join, as 40 ranks on 2 cores do; start() waits as
    the Ray group does, in slices that look for a cancel."""

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        self.log.append("start")
        deadline = time.monotonic() + join_timeout_s
        while time.monotonic() < deadline:
            if cancelled():
                raise StartCancelled("cancelled while the workers were starting")
            time.sleep(0.01)
        raise TimeoutError("the world did not form in time")


def test_a_cancel_while_the_workers_start_ends_the_job_at_once(tmp_path: Path) -> None:
    workers = SlowToJoin([[status(0, "stopped", 0), status(1, "stopped", 0)]])
    sup = make(tmp_path, workers)
    threading.Timer(0.3, sup.cancel).start()
    started = time.monotonic()
    assert sup.run() == JobState.CANCELLED
    assert time.monotonic() - started < 10  # not the 300 s join timeout
    assert workers.log[:2] == ["reserve", "start"] and "release" in workers.log
    # Straight from STARTING: not counted as a failure, no restart on the way.
    assert states(sup.buffer) == ["CANCELLING", "CANCELLED"]


def test_cancel_stops_and_releases(tmp_path: Path) -> None:
    workers = FakeWorkers([[status(0, "stopped", 3), status(1, "stopped", 3)]])
    sup = make(tmp_path, workers)
    sup.cancel()
    assert sup.run() == JobState.CANCELLED
    assert workers.log == ["stop", "release"]
