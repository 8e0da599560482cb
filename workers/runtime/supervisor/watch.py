"""One verdict on a worker group from its ranks' typed statuses: healthy, finished,
failed, non-finite or hung. Pure: the supervisor polls, this reads the fields (never the
error text), and the supervisor acts on the verdict."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum

from shardline.workers.contract.status import NonFiniteStep, WorkerPhase, WorkerStatus


class Verdict(StrEnum):
    HEALTHY = "healthy"
    FINISHED = "finished"  # every rank is done
    FAILED = "failed"
    NONFINITE = "nonfinite"  # every failed rank failed on a non-finite loss
    HUNG = "hung"  # a started world made no progress for hang_timeout_s


@dataclass(frozen=True)
class GroupStatus:
    statuses: list[WorkerStatus]
    verdict: Verdict
    error: str = ""  # what went wrong, naming the ranks
    ranks: list[int] = field(default_factory=list)  # the ranks to blame (first failed, behind)
    lost: list[int] = field(default_factory=list)  # ranks that died or stopped answering
    deterministic: bool = False  # the job's own error: retrying cannot help
    nonfinite: NonFiniteStep | None = None
    rank_steps: dict[int, int] | None = None  # a hang: the step each rank had reached
    stalled_s: float = 0.0  # a hang: how long the longest-stalled rank made no progress

    def to_replace(self) -> list[int]:
        """The ranks a recovery in place replaces: the lost ones and, while some rank
        still trains (it waits in a collective of the failed world), the failed ones too.
        A failed rank's process keeps its gloo connections open (destroy_process_group()
        and abort() do not close them, and torch's caches keep the groups' meshes), so its
        peers wait for it until it is gone. Where every rank failed, none waits."""
        failed = {s.rank for s in self.statuses if s.phase == WorkerPhase.FAILED}
        if failed | set(self.lost) >= {s.rank for s in self.statuses}:
            return sorted(self.lost)
        return sorted(failed | set(self.lost))


def judge(statuses: list[WorkerStatus], *, hang_timeout_s: float) -> GroupStatus:
    if not statuses:  # a group with no ranks cannot be training
        return GroupStatus(statuses, Verdict.FAILED, "no rank answered", ranks=[])
    failed = [s for s in statuses if s.phase == WorkerPhase.FAILED]
    if failed and all(s.nonfinite for s in failed):
        return GroupStatus(
            statuses,
            Verdict.NONFINITE,
            ranks=[s.rank for s in failed],
            nonfinite=failed[0].nonfinite,
        )
    if failed:
        lost = [s.rank for s in failed if s.lost]
        return GroupStatus(
            statuses,
            Verdict.FAILED,
            "; ".join(f"rank {s.rank}: {s.error}" for s in failed),
            # The ranks whose process died or stopped answering failed first; their peers'
            # collective errors ("connection reset") only follow.
            ranks=lost or [s.rank for s in failed],
            lost=lost,
            deterministic=any(s.deterministic for s in failed),
        )
    hung = hung_ranks(statuses, hang_timeout_s)
    if hung:
        at = {s.rank: s.step for s in statuses}
        behind = ", ".join(f"rank {r} at step {at[r]}" for r in hung)
        return GroupStatus(
            statuses,
            Verdict.HUNG,
            f"no progress for {hang_timeout_s:.0f}s on rank(s) {hung} ({behind}; the front at "
            f"step {max(at.values())})",
            ranks=hung,
            lost=hung,
            rank_steps=at,
            stalled_s=stalled_for(statuses, hung),
        )
    if all(s.phase == WorkerPhase.DONE for s in statuses):
        return GroupStatus(statuses, Verdict.FINISHED)
    return GroupStatus(statuses, Verdict.HEALTHY)


def hung_ranks(statuses: list[WorkerStatus], limit_s: float) -> list[int]:
    """The ranks to blame for a hang: those behind the front where there are some."""
    # Joining has its own timeout, and ranks already training wait, rightly, on one still
    # building its model: only a fully started world can hang.
    if any(s.phase in (WorkerPhase.IDLE, WorkerPhase.JOINING) for s in statuses):
        return []
    now = time.time()
    hung = [
        s.rank
        for s in statuses
        if s.phase == WorkerPhase.TRAINING and now - s.last_progress > limit_s
    ]
    if not hung:
        return []
    front = max(s.step for s in statuses)
    behind = [s.rank for s in statuses if s.step < front]
    return behind or hung


def stalled_for(statuses: list[WorkerStatus], ranks: list[int]) -> float:
    """How long ago the longest-stalled of `ranks` last made progress (0 if none did)."""
    now = time.time()
    return max((now - s.last_progress for s in statuses if s.rank in ranks), default=0.0)
