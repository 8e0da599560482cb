"""What a rank reports on each poll: typed, plain data that Ray pickles as it is.

The worker builds a WorkerStatus, the worker group returns one per rank (a rank that
died or did not answer gets one from `WorkerStatus.lost_rank`), and the supervisor reads
its attributes. No torch or Ray here: the supervisor's helpers import it freely.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from shardline.workers.contract.events import Event
from shardline.workers.contract.progress import CheckpointCommit


class WorkerPhase(StrEnum):
    IDLE = "idle"
    JOINING = "joining"
    TRAINING = "training"
    DONE = "done"
    STOPPED = "stopped"
    FAILED = "failed"


# Phases after which a worker does nothing more.
FINISHED = frozenset({WorkerPhase.DONE, WorkerPhase.STOPPED, WorkerPhase.FAILED})

# One logged step's metrics, as the engine logs them: a dict, because its names depend on
# what the job does (checkpoint and snapshot timings appear only on the steps that save),
# and it is stored as JSON as it is.
StepMetrics = dict[str, Any]


@dataclass(frozen=True)
class NonFiniteStep:
    """The step whose loss was not finite, and the batch it trained on."""

    step: int
    batch: int
    loss: float


@dataclass
class WorkerStatus:
    """What a poll returns: plain data, cheap to send."""

    rank: int
    phase: WorkerPhase
    step: int
    loss: float | None
    last_progress: float  # wall-clock time of the last completed step (or of the start)
    error: str | None = None
    deterministic: bool = False  # the error is the job's own: retrying cannot help
    lost: bool = False  # the rank itself died or hung (not a peer's error it saw)
    # Rank 0 only, each since the previous poll:
    metrics: list[StepMetrics] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)  # what rank 0's trainer said
    checkpoints: list[CheckpointCommit] = field(default_factory=list)  # committed ones
    summary: dict[str, Any] | None = None
    nonfinite: NonFiniteStep | None = None  # the error says so too

    @classmethod
    def lost_rank(cls, rank: int, error: str) -> WorkerStatus:
        """A rank whose actor died or did not answer a poll: failed, and lost."""
        return cls(
            rank=rank,
            phase=WorkerPhase.FAILED,
            step=0,
            loss=None,
            last_progress=time.time(),
            error=error,
            lost=True,
        )
