"""One failure budget per job, whatever happens to its supervisors; pause and cancel spend
none of it and every state a supervisor reports is a legal edge.

The real reconciler over a real job store (a SQLite file) reads real supervisors; only
their worker groups are scripted, and "losing" a supervisor means the reconciler no longer
finds it, as when its actor dies.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import shardline.workers.runtime.supervisor.machine as machine
from shardline.service.models import Job
from shardline.service.reconciler import Reconciler
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState, is_legal
from shardline.workers.contract.progress import ProgressRead, StateEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import NonFiniteStep, WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor import JobSupervisor
from shardline.workers.storage.layout import JobLayout


def status(rank: int, phase: WorkerPhase, step: int, **extra: Any) -> WorkerStatus:
    summary = {"final_loss": 1.0} if phase == WorkerPhase.DONE else None
    return WorkerStatus(rank, phase, step, 1.0, time.time(), summary=summary, **extra)


def training(step: int) -> list[WorkerStatus]:
    return [status(0, WorkerPhase.TRAINING, step), status(1, WorkerPhase.TRAINING, step)]


def done() -> list[WorkerStatus]:
    return [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]


def nonfinite(step: int) -> list[WorkerStatus]:
    bad = NonFiniteStep(step=step, batch=step, loss=float("nan"))
    failed = WorkerPhase.FAILED
    return [status(r, failed, step - 1, error="NonFiniteLoss", nonfinite=bad) for r in (0, 1)]


def rank_died() -> list[WorkerStatus]:
    return [
        status(0, WorkerPhase.TRAINING, 5),
        WorkerStatus.lost_rank(1, "its actor died: ActorDiedError"),
    ]


class ScriptedWorkers:
    """Each start plays the next list of polls (the last one repeated); a stop makes the
    ranks stop at their step, unless `stubborn` (they keep training)."""

    warm_start = False
    pooled_ranks = 0

    def __init__(
        self, *starts: list[list[WorkerStatus]], stubborn: bool = False, failing_starts: int = 0
    ) -> None:
        self.starts = list(starts)
        self.failing_starts = failing_starts  # starts that raise (a join that timed out)
        self.polls: list[list[WorkerStatus]] = []
        self.stubborn = stubborn
        self.stopping = False

    def reserve(self, timeout_s: float) -> list[str]:
        return ["node-a", "node-a"]

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        if self.failing_starts:
            self.failing_starts -= 1
            raise TimeoutError("the world did not form in time")
        self.polls = list(self.starts.pop(0))

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        now = self.polls.pop(0) if len(self.polls) > 1 else self.polls[0]
        if self.stopping and not self.stubborn:
            return [status(s.rank, WorkerPhase.STOPPED, s.step) for s in now]
        return now

    def request_stop(self, save: bool = False) -> None:
        self.stopping = True

    def kill_workers(self) -> None:
        self.stopping = False

    def release(self) -> None:
        self.stopping = False

    def inject_fault(self, rank: int, kind: str) -> None:
        raise NotImplementedError

    def profile(self, profile_id: str, steps: int) -> int:
        raise NotImplementedError


class InProcessSupervisors:
    """The reconciler's view of supervisors, holding real JobSupervisors in this process.
    Each launch takes the next scripted worker group."""

    def __init__(self, root: Path, groups: list[ScriptedWorkers]) -> None:
        self.root = root
        self.groups = groups
        self.live: dict[str, JobSupervisor] = {}
        self.launched: list[JobSupervisor] = []

    def exists(self, job_id: str) -> bool:
        return job_id in self.live

    def launch(self, job: Job) -> None:
        sup = JobSupervisor(
            JobLayout(str(self.root), job.id),
            JobSpec.model_validate(job.spec),
            workers=self.groups.pop(0),
            recorded_step=job.current_step,
            failures=job.failures,
            recovering=job.state == JobState.RESTARTING,
        )
        self.live[job.id] = sup
        self.launched.append(sup)

    def read(self, job_id: str, after_seq: int) -> ProgressRead | None:
        return self.live[job_id].read(after_seq)

    def cancel(self, job_id: str) -> None:
        self.live[job_id].cancel()

    def pause(self, job_id: str) -> None:
        self.live[job_id].pause()

    def remove(self, job_id: str) -> None:
        self.live.pop(job_id, None)

    def lose(self, job_id: str) -> None:
        """The supervisor's actor died (with its workers)."""
        del self.live[job_id]


@pytest.fixture(autouse=True)
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine, "POLL_INTERVAL_S", 0.0)
    monkeypatch.setattr(machine, "STOP_GRACE_S", 0.2)
    monkeypatch.setattr(machine, "PAUSE_GRACE_S", 5.0)


def started(
    store: JobStore, supervisors: InProcessSupervisors, **ft: Any
) -> tuple[str, JobSupervisor]:
    """A job admitted by the scheduler: STARTING, with its supervisor launched."""
    owner = UserDirectory(store.db).ensure_user("alice")
    spec = JobSpec.model_validate({"name": "budget", "parallel": {"dp": 2}, "fault_tolerance": ft})
    job, _ = store.create(owner, spec)
    job = store.transition(job.id, JobState.STARTING, "admitted")
    supervisors.launch(job)
    return job.id, supervisors.live[job.id]


def running(
    store: JobStore, groups: list[ScriptedWorkers], tmp_path: Path, max_failures: int
) -> tuple[str, InProcessSupervisors, Reconciler, JobSupervisor]:
    """A job whose first supervisor got it RUNNING; the reconciler has recorded that."""
    supervisors = InProcessSupervisors(tmp_path, groups)
    reconciler = Reconciler(store, supervisors)
    job_id, sup = started(store, supervisors, max_failures=max_failures)
    advance(sup, 2)
    reconciler.tick()
    return job_id, supervisors, reconciler, sup


def lost_while_running(
    store: JobStore, groups: list[ScriptedWorkers], tmp_path: Path, max_failures: int
) -> tuple[str, InProcessSupervisors, Reconciler]:
    """A job whose first supervisor got it RUNNING, then was lost; the reconciler has
    looked once since."""
    job_id, supervisors, reconciler, _ = running(store, groups, tmp_path, max_failures)
    supervisors.lose(job_id)
    reconciler.tick()
    return job_id, supervisors, reconciler


def advance(sup: JobSupervisor, steps: int) -> None:
    for _ in range(steps):
        nxt = sup.step()
        if nxt.state != sup.state:
            sup._enter(nxt)


def messages(store: JobStore, job_id: str) -> list[str]:
    return [e.message for e in store.events(job_id, limit=1000)]


def reported_edges(sup: JobSupervisor, first: JobState) -> list[tuple[JobState, JobState]]:
    states = [JobState(e.state) for e in sup.buffer.after(0) if isinstance(e, StateEntry)]
    return list(zip([first, *states], states, strict=False))


def test_a_nan_rollback_then_a_lost_supervisor_succeeds_at_max_failures_1(
    store: JobStore, tmp_path: Path
) -> None:
    supervisors = InProcessSupervisors(
        tmp_path,
        [
            ScriptedWorkers([training(5), nonfinite(6)], [training(6)]),
            ScriptedWorkers([training(7), done()]),
        ],
    )
    reconciler = Reconciler(store, supervisors)
    job_id, first = started(store, supervisors, max_failures=1)
    advance(first, 4)  # RUNNING, a non-finite loss: RESTARTING, RUNNING again
    reconciler.tick()
    assert store.get(job_id).state == JobState.RUNNING
    assert (store.get(job_id).restarts, store.get(job_id).failures) == (1, 0)

    supervisors.lose(job_id)
    reconciler.tick()  # a real failure: the first of the one allowed
    job = store.get(job_id)
    assert (job.state, job.restarts, job.failures) == (JobState.RESTARTING, 2, 1)
    second = supervisors.live[job_id]
    assert second.failures == 1  # the new supervisor starts from the stored count
    assert second.run() == JobState.SUCCEEDED
    reconciler.tick()
    job = store.get(job_id)
    assert (job.state, job.restarts, job.failures) == (JobState.SUCCEEDED, 2, 1), messages(
        store, job_id
    )


def test_a_lost_supervisor_then_a_killed_worker_fails_naming_max_failures(
    store: JobStore, tmp_path: Path
) -> None:
    groups = [ScriptedWorkers([training(5)]), ScriptedWorkers([training(6), rank_died()])]
    job_id, supervisors, reconciler = lost_while_running(store, groups, tmp_path, 1)
    assert store.get(job_id).failures == 1
    assert supervisors.live[job_id].run() == JobState.FAILED
    reconciler.tick()
    job = store.get(job_id)
    assert (job.state, job.failures) == (JobState.FAILED, 2)
    assert "rank 1: its actor died" in (job.failure_reason or "")
    assert "failure 2, more than fault_tolerance.max_failures=1" in (job.failure_reason or "")


def test_a_failure_that_changes_no_state_is_counted_all_the_same(
    store: JobStore, tmp_path: Path
) -> None:
    """The new supervisor of a lost one starts RESTARTING; its first start fails and it
    stays RESTARTING (no new state to report), yet the failure is the job's second."""
    groups = [
        ScriptedWorkers([training(5)]),
        ScriptedWorkers([training(6), done()], failing_starts=1),
    ]
    job_id, supervisors, reconciler = lost_while_running(store, groups, tmp_path, 3)
    second = supervisors.live[job_id]
    second.handling.policy.base_backoff_s = 0.0
    assert second.run() == JobState.SUCCEEDED
    reconciler.tick()
    job = store.get(job_id)
    assert (job.state, job.failures) == (JobState.SUCCEEDED, 2), messages(store, job_id)


def test_a_lost_supervisor_past_the_budget_fails_the_job_naming_max_failures(
    store: JobStore, tmp_path: Path
) -> None:
    job_id, _, _ = lost_while_running(store, [ScriptedWorkers([training(5)])], tmp_path, 0)
    job = store.get(job_id)
    assert (job.state, job.failures) == (JobState.FAILED, 1)
    assert "supervisor is gone" in (job.failure_reason or "")
    assert "max_failures=0" in (job.failure_reason or "")


def test_a_pause_spends_nothing_reports_legal_edges_and_stops_the_loop(
    store: JobStore, tmp_path: Path
) -> None:
    groups = [ScriptedWorkers([training(5)])]
    job_id, supervisors, reconciler, sup = running(store, groups, tmp_path, 3)
    store.request_pause(job_id, UserDirectory(store.db).ensure_user("alice"), "pause")
    reconciler.tick()  # carries the pause to the supervisor
    advance(sup, 3)
    assert sup.state == JobState.PAUSED
    assert sup.run() == JobState.PAUSED  # the loop does not run on once paused
    reconciler.tick()
    job = store.get(job_id)
    assert (job.state, job.failures, job.restarts) == (JobState.PAUSED, 0, 0)
    assert not any(m.startswith("failure") for m in messages(store, job_id))
    assert all(is_legal(a, b) for a, b in reported_edges(sup, JobState.STARTING))
    assert not supervisors.exists(job_id)  # a paused job holds no supervisor


def test_a_pause_then_a_cancel_ends_cancelled_with_no_failure(
    store: JobStore, tmp_path: Path
) -> None:
    # The ranks never finish their pause checkpoint: only the cancel ends the wait.
    groups = [ScriptedWorkers([training(5)], stubborn=True)]
    job_id, _, reconciler, sup = running(store, groups, tmp_path, 516)
    alice = UserDirectory(store.db).ensure_user("alice")
    store.request_pause(job_id, alice, "pause")
    reconciler.tick()
    sup.start()  # its loop: PAUSING, then waiting for the pause's checkpoint
    while not (sup.state == JobState.PAUSING and sup.workers.stopping):  # type: ignore[attr-defined]
        time.sleep(0.01)
    store.request_cancel(job_id, alice, "cancel")
    cancelled_at = time.monotonic()
    reconciler.tick()  # carries the cancel: the wait ends at once
    assert sup._thread is not None
    sup._thread.join(timeout=30)
    assert sup.state == JobState.CANCELLED
    assert time.monotonic() - cancelled_at < 3  # not the pause's grace (5 s here)
    reconciler.tick()
    job = store.get(job_id)
    assert (job.state, job.failures, job.restarts) == (JobState.CANCELLED, 0, 0)
    assert not any(m.startswith("failure") for m in messages(store, job_id))
    assert all(is_legal(a, b) for a, b in reported_edges(sup, JobState.STARTING))
