"""When a recovery closes: at rank 0's first step past the restore it reports, never at
another rank's step seen before rank 0 said what it restored (polls answer one by one)."""

from __future__ import annotations

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.recovery import Recoveries


def status(rank: int, step: int, events: list[Event] | None = None) -> WorkerStatus:
    phase = WorkerPhase.TRAINING if step else WorkerPhase.JOINING
    return WorkerStatus(rank, phase, step, None, 0.0, events=events or [])


def test_a_step_of_another_rank_before_rank_0_said_its_restore_does_not_close() -> None:
    recoveries = Recoveries()
    recoveries.open("a node was lost", [2, 3], front_step=6)
    # Rank 0 answered before it restored; rank 1 answered after the first step.
    assert recoveries.observe(None, [status(0, 0), status(1, 5)], None) is None
    restored = Event(EventKind.RESTORED, "restored", {"step": 4, "tier": "memory"})
    closed = recoveries.observe(restored, [status(0, 5, [restored]), status(1, 5)], 0.1)
    assert closed is not None
    assert closed.data["restored_step"] == 4 and closed.data["restored_tier"] == "memory"
    assert closed.data["steps_lost"] == 2
