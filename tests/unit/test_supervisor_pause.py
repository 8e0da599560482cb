"""Pausing a job: the supervisor stops its ranks with a checkpoint, frees them, and ends
PAUSED; checkpoint commits and rank events reach the progress buffer once."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import shardline.workers.runtime.supervisor.machine as supervisor_module
from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import (
    CheckpointCommit,
    CheckpointEntry,
    EventEntry,
    MetricsEntry,
    StateEntry,
)
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.decisions import Next
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.runtime.supervisor.workers import checkpoint_locations
from shardline.workers.storage.checkpoints import RestoreSource
from shardline.workers.storage.layout import JobLayout


def status(rank: int, phase: WorkerPhase, step: int, **extra: Any) -> WorkerStatus:
    fields: dict[str, Any] = {"last_progress": time.time(), **extra}
    return WorkerStatus(rank=rank, phase=phase, step=step, loss=1.0, **fields)


class PausableWorkers:
    """Two ranks that train until asked to stop, then report a checkpoint and stop."""

    warm_start = False
    pooled_ranks = 0

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.stopping = False

    def reserve(self, timeout_s: float) -> list[str]:
        return ["node-a", "node-a"]

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        self.calls.append("start")

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        if not self.stopping:
            return [status(0, WorkerPhase.TRAINING, 5), status(1, WorkerPhase.TRAINING, 5)]
        commit = CheckpointCommit(
            step=6,
            path="/x/step-00000006",
            bytes=10,
            layout="l",
            save_s=0.5,
            blocking_s=0.5,
            deleted=[],
        )
        event = Event(EventKind.CHECKPOINT_COMMITTED, "checkpoint step 6 committed", {"step": 6})
        first = status(0, WorkerPhase.STOPPED, 6, checkpoints=[commit], events=[event])
        self.stopping = False  # reported once, as a real rank does
        self.stopped = True
        return [first, status(1, WorkerPhase.STOPPED, 6)]

    def request_stop(self, save: bool = False) -> None:
        self.calls.append(f"stop(save={save})")
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


def test_pause_checkpoints_releases_and_ends_paused(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.setattr(supervisor_module, "POLL_INTERVAL_S", 0.0)
    workers = PausableWorkers()
    spec = JobSpec(name="t")
    sup = JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)
    assert sup.step().state == JobState.RUNNING
    sup._enter(Next(JobState.RUNNING))
    assert sup.step().state == JobState.RUNNING  # training, nothing asked
    sup.pause()
    sup._enter(sup.step())
    assert sup.state == JobState.PAUSING  # a legal edge: RUNNING -> PAUSING -> PAUSED
    sup._enter(sup.step())
    assert sup.state == JobState.PAUSED
    assert workers.calls == ["start", "stop(save=True)", "release"]
    entries = sup.buffer.after(0)
    checkpoints = [e for e in entries if isinstance(e, CheckpointEntry)]
    assert [c.commit.step for c in checkpoints] == [6]
    assert any(isinstance(e, EventEntry) and "committed" in e.message for e in entries)
    states = [e for e in entries if isinstance(e, StateEntry)]
    assert states[-1].state == JobState.PAUSED and states[-1].reason == "paused after step 6"


def test_a_job_resumes_from_its_own_checkpoints_before_resume_from(tmp_path: Path) -> None:
    spec = JobSpec(name="t", resume_from={"job_id": "src1", "step": 4})  # type: ignore[arg-type]
    targets = checkpoint_locations(spec, JobLayout(str(tmp_path), "job2"))
    assert targets.save_url == str(tmp_path / "job2" / "checkpoints")
    assert targets.restore_from == (
        RestoreSource(str(tmp_path / "job2" / "checkpoints")),
        RestoreSource(str(tmp_path / "src1" / "checkpoints"), step=4),
    )
    own, source = targets.restore_from
    assert [s for s in (6, 7, 8) if own.accepts(s)] == [6, 7, 8]
    assert [s for s in (3, 4, 5) if source.accepts(s)] == [4]


def test_a_replacement_supervisor_replays_metrics_the_database_never_got(
    tmp_path: Path,
) -> None:
    logged = tmp_path / "job3" / "metrics.jsonl"
    logged.parent.mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 1.0 / s}) for s in range(1, 9)]
    logged.write_text("\n".join(lines) + '\n{"step": 9, "lo')  # the last write was cut
    spec = JobSpec(name="t")
    layout = JobLayout(str(tmp_path), "job3")
    sup = JobSupervisor(layout, spec, workers=PausableWorkers(), recorded_step=5)
    assert sup.step().state == JobState.RUNNING
    replayed = [e for e in sup.buffer.after(0) if isinstance(e, MetricsEntry)]
    assert [e.step for e in replayed] == [6, 7, 8]
    assert sup.relay.reported_step == 8
