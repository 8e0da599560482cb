"""Job states and the legal edges between them (shared/ARCHITECTURE.md, "Job states")."""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE = frozenset(JobState) - TERMINAL

_FORWARD: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RESTARTING}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.RESTARTING}),
    JobState.RESTARTING: frozenset({JobState.RUNNING}),
    JobState.CANCELLING: frozenset({JobState.CANCELLED}),
}


def is_legal(src: JobState, dst: JobState) -> bool:
    """Whether a job may move from `src` to `dst`."""
    if src.terminal:
        return False
    if dst in (JobState.CANCELLING, JobState.FAILED):
        # Any non-terminal job may be cancelled or fail; cancelling twice is not an edge.
        return src != dst
    return dst in _FORWARD.get(src, frozenset())
