"""The job lifecycle, defined once: states, legal edges, which are terminal.

Imported by the job store, the supervisor, the reconciler, the SDK and the CLI
(docs/architecture.md, "The job's states"). Pure Python: the SDK imports it.
"""

from __future__ import annotations

from enum import StrEnum


class JobState(StrEnum):
    QUEUED = "QUEUED"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RESTARTING = "RESTARTING"
    PAUSING = "PAUSING"
    PAUSED = "PAUSED"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def terminal(self) -> bool:
        return self in TERMINAL


TERMINAL = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
ACTIVE = frozenset(JobState) - TERMINAL
# States in which a job has a supervisor (QUEUED and PAUSED jobs hold nothing on Ray).
SUPERVISED = ACTIVE - {JobState.QUEUED, JobState.PAUSED}

_FORWARD: dict[JobState, frozenset[JobState]] = {
    JobState.QUEUED: frozenset({JobState.STARTING}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RESTARTING}),
    JobState.RUNNING: frozenset({JobState.SUCCEEDED, JobState.RESTARTING, JobState.PAUSING}),
    JobState.RESTARTING: frozenset({JobState.RUNNING}),
    # A job may finish its last step before the pause takes effect.
    JobState.PAUSING: frozenset({JobState.PAUSED, JobState.SUCCEEDED}),
    JobState.PAUSED: frozenset({JobState.QUEUED}),
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
