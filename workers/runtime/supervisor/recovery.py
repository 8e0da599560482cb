"""One recovery, from the failure to the first new step, and what it cost the user.

The supervisor opens a Recovery when it tears the workers down and closes it when a rank
trains past the snapshot it restored; the closing event is what users (and the
reconciler's goodput accounting) see.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.status import WorkerPhase, WorkerStatus


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
    restored_tier: str | None = None  # where it came from: "memory" or "storage"
    in_place: bool = False  # only `replaced` restarted; the other ranks kept their processes
    replaced: list[int] = field(default_factory=list)
    why_not_in_place: str | None = None  # why every rank restarted instead

    def plan_in_place(self, why_not: str | None, lost: list[int]) -> None:
        """Replace only `lost`, or (`why_not` says why) restart every rank."""
        self.in_place, self.why_not_in_place = why_not is None, why_not
        self.replaced = sorted(lost) if why_not is None else []

    def in_place_failed(self, why: str) -> None:
        """The recovery in place could not go on: every rank restarts instead."""
        self.plan_in_place(f"tried in place, but {why}", [])

    def closing_event(self, step_time_s: float | None) -> Event:
        """The event once a rank trains past `restored_step` (the reconciler adds its
        figures to the job). Seconds lost are the time to recover plus the time to train
        the lost steps again."""
        seconds = time.monotonic() - self.failed_at
        lost = max(self.front_step - self.restored_step, 0)
        seconds_lost = seconds + lost * (step_time_s or 0.0)
        where = f" on rank(s) {self.ranks}" if self.ranks else ""
        skipped = (
            f", skipped batch {self.skipped['batch']} of step {self.skipped['step']}"
            if self.skipped
            else ""
        )
        how = (
            f"in place (rank(s) {self.replaced} replaced, the others kept their processes)"
            if self.in_place
            else f"restarting every rank ({self.why_not_in_place or 'a full restart'})"
        )
        message = (
            f"recovered in {seconds:.1f}s from {self.cause or 'a failure'}{where}: failed near "
            f"step {self.front_step}, resumed after step {self.restored_step}, {lost} step(s) "
            f"trained again{skipped}; {how}"
        )
        data: dict[str, Any] = {
            "cause": self.cause,
            "ranks": self.ranks,
            "nodes": self.nodes,
            "rank_steps": self.rank_steps,
            "skipped": self.skipped,
            "injected": self.injected,
            "restored_step": self.restored_step,
            "restored_tier": self.restored_tier,
            "in_place": self.in_place,
            "replaced": self.replaced,
            "why_not_in_place": self.why_not_in_place,
            "front_step": self.front_step,
            "mttr_s": seconds,
            "steps_lost": lost,
            "seconds_lost": seconds_lost,
        }
        return Event(EventKind.RECOVERY, message, data)


class Recoveries:
    """The recovery in progress, if any: opened at a failure, moved on by the restore and
    closed by the first new step. Also remembers the fault an admin injected (and where
    each rank ran) so the recovery can name them."""

    def __init__(self) -> None:
        self.current: Recovery | None = None
        self.injected: list[tuple[str, int]] = []  # (kind, rank) since the last recovery
        self.nodes: list[str] = []  # each rank's node, as placed

    def inject(self, kind: str, rank: int) -> str:
        """Remember a fault delivered to `rank`; how events name it."""
        self.injected.append((kind, rank))
        return f"{kind} on rank {rank}"

    def open(
        self, cause: str, ranks: list[int], front_step: int, stalled_s: float = 0.0
    ) -> Recovery:
        nodes = sorted({self.nodes[r] for r in ranks if r < len(self.nodes)})
        self.current = Recovery(time.monotonic() - stalled_s, front_step, cause, ranks, nodes)
        # Name the faults injected on the ranks that failed; where none match (a rank the
        # fault broke reported first), every fault injected since the last recovery.
        named = [(k, r) for k, r in self.injected if r in ranks] or self.injected
        self.current.injected = "; ".join(f"{k} on rank {r}" for k, r in named) or None
        self.injected = []  # the next attempt's workers have none of them
        return self.current

    def observe(
        self, restored: Event | None, statuses: list[WorkerStatus], step_time_s: float | None
    ) -> Event | None:
        """After a poll: the closing event once a rank trains past the restored step."""
        rec = self.current
        if rec is None:
            return None
        if restored is not None:
            rec.restored_step = int(restored.data["step"])
            rec.restored_tier = restored.data.get("tier")
        # Rank 0's status alone: its events carry the restore. Polls answer one by one,
        # so another rank's may show a step trained after the restore while rank 0's,
        # answered earlier, has not yet said it (the recovery then read "after step 0").
        if not any(
            s.rank == 0 and s.phase == WorkerPhase.TRAINING and s.step > rec.restored_step
            for s in statuses
        ):
            return None
        self.current = None
        return rec.closing_event(step_time_s)
