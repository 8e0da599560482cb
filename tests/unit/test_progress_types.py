"""The typed shapes of progress: what crosses Ray from a rank, and what the buffer holds."""

from __future__ import annotations

import pickle

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.progress import (
    CheckpointCommit,
    CheckpointEntry,
    ProgressBuffer,
    StateEntry,
)
from shardline.workers.contract.status import NonFiniteStep, WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.watch import Verdict, judge

# What workers/engine/checkpoint/tier.py hands on_commit for a save that pruned two older ones.
ENGINE_SUMMARY = {
    "step": 8,
    "path": "/ckpt/step-00000008",
    "bytes": 123,
    "layout": "dp=2",
    "save_s": 1.5,
    "blocking_s": 0.25,
    "deleted": [2, 4],
}


def test_a_commit_keeps_the_steps_keep_last_pruned() -> None:
    # The store deletes those rows: losing them would list checkpoints that are gone.
    commit = CheckpointCommit.from_summary(ENGINE_SUMMARY)
    assert commit.deleted == [2, 4]
    assert (commit.step, commit.path, commit.bytes) == (8, "/ckpt/step-00000008", 123)
    assert (commit.layout, commit.save_s, commit.blocking_s) == ("dp=2", 1.5, 0.25)


def test_a_status_survives_pickling_as_ray_sends_it() -> None:
    status = WorkerStatus(
        rank=0,
        phase=WorkerPhase.FAILED,
        step=6,
        loss=None,
        last_progress=1.0,
        error="NonFiniteLoss: nan",
        metrics=[{"step": 5, "loss": 2.0}],
        events=[Event(EventKind.RESTORED, "restored checkpoint step 4", {"step": 4})],
        checkpoints=[CheckpointCommit.from_summary(ENGINE_SUMMARY)],
        nonfinite=NonFiniteStep(step=6, batch=6, loss=float("inf")),
    )
    again = pickle.loads(pickle.dumps(status))
    assert again == status and again.phase is WorkerPhase.FAILED


def test_a_lost_rank_is_failed_lost_and_named_before_its_peers() -> None:
    dead = WorkerStatus.lost_rank(1, "its actor died: ActorDiedError")
    assert (dead.phase, dead.lost, dead.step, dead.deterministic) == (
        WorkerPhase.FAILED,
        True,
        0,
        False,
    )
    peer = WorkerStatus(0, WorkerPhase.FAILED, 4, None, 0.0, error="Connection reset by peer")
    group = judge([peer, dead], hang_timeout_s=60)
    assert group.verdict == Verdict.FAILED and group.ranks == [1] and group.lost == [1]


def test_the_buffer_numbers_entries_it_is_given() -> None:
    buffer = ProgressBuffer()
    commit = CheckpointCommit.from_summary(ENGINE_SUMMARY)
    assert buffer.append(StateEntry(state="RUNNING", reason="2 workers started")) == 1
    assert buffer.append(CheckpointEntry(commit=commit)) == 2
    assert [(e.seq, e.kind) for e in buffer.after(0)] == [(1, "state"), (2, "checkpoint")]
