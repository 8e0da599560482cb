"""One recovery, from the failure to the first new step, and what it cost the user.

The supervisor opens a Recovery when it tears the workers down and closes it when a rank
trains past the snapshot it restored; the closing event is what users (and the
reconciler's goodput accounting) see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from workers.contract.status import WorkerStatus

# Marks the event that closes a recovery; the reconciler adds its figures to the job.
RECOVERY_EVENT = "recovery"


@dataclass
class Recovery:
    failed_at: float  # time.monotonic() when the failure happened (a hang: when it stalled)
    front_step: int  # the furthest step reached before it
    cause: str = ""
    ranks: list[int] = field(default_factory=list)  # the ranks that failed or were behind
    nodes: list[str] = field(default_factory=list)  # the nodes those ranks ran on
    rank_steps: dict[int, int] | None = None  # a hang: the step each rank had reached
    skipped: dict[str, int] | None = None  # a non-finite loss: {"step", "batch"} skipped
    injected: str | None = None  # the fault an admin injected, if one did
    restored_step: int = 0  # the snapshot the new workers started from (0: none)

    def closing_event(self, step_time_s: float | None) -> tuple[str, dict[str, Any]]:
        """(message, data) once a rank trains past `restored_step`. Seconds lost are the
        time to recover plus the time to train the lost steps again."""
        seconds = time.monotonic() - self.failed_at
        lost = max(self.front_step - self.restored_step, 0)
        seconds_lost = seconds + lost * (step_time_s or 0.0)
        where = f" on rank(s) {self.ranks}" if self.ranks else ""
        skipped = (
            f", skipped batch {self.skipped['batch']} of step {self.skipped['step']}"
            if self.skipped
            else ""
        )
        message = (
            f"recovered in {seconds:.1f}s from {self.cause or 'a failure'}{where}: failed near "
            f"step {self.front_step}, resumed after step {self.restored_step}, {lost} step(s) "
            f"trained again{skipped}"
        )
        data: dict[str, Any] = {
            "kind": RECOVERY_EVENT,
            "cause": self.cause,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "rank_steps": self.rank_steps,
            "skipped": self.skipped,
            "injected": self.injected,
            "restored_step": self.restored_step,
            "front_step": self.front_step,
            "mttr_s": seconds,
            "steps_lost": lost,
            "seconds_lost": seconds_lost,
        }
        return message, data


# How workers/runtime/worker_group.py describes a rank whose process is gone or does not answer.
_LOST_RANK = ("its actor died", "did not answer a poll")


def first_failed_ranks(failed: list[WorkerStatus]) -> list[int]:
    """The ranks that failed first: those whose process died or stopped answering, when
    there are such; their peers' collective errors ("connection reset") only follow."""
    lost = [s.rank for s in failed if (s.error or "").startswith(_LOST_RANK)]
    return lost or [s.rank for s in failed]


def stalled_for(statuses: list[WorkerStatus], ranks: list[int]) -> float:
    """How long ago the longest-stalled of `ranks` last made progress (0 if none did)."""
    now = time.time()
    return max((now - s.last_progress for s in statuses if s.rank in ranks), default=0.0)
