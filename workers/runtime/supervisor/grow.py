"""Elastic grow-back: a job re-planned on fewer ranks looks now and then whether the
cluster could hold the layout it asked for again, and says so when it grows."""

from __future__ import annotations

import time

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.placement.elastic import describe_layout
from shardline.workers.runtime.placement.reservation import ResizableWorkers

# How often a shrunk elastic job looks for the capacity to grow back.
GROW_CHECK_S = 5.0


class GrowBack:
    def __init__(self, full: JobSpec, check_every_s: float = GROW_CHECK_S) -> None:
        self.full = full  # the layout the user asked for
        self.check_every_s = check_every_s
        self._checked = 0.0

    def due(self, running: JobSpec, workers: object) -> bool:
        """Whether a job running at `running` could grow back to its full size now (a
        cheap check, at most every `check_every_s`)."""
        if running.parallel.world_size >= self.full.parallel.world_size or not isinstance(
            workers, ResizableWorkers
        ):
            return False
        if time.monotonic() - self._checked < self.check_every_s:
            return False
        self._checked = time.monotonic()
        return workers.has_room_for(self.full)

    def event(self, running: JobSpec) -> Event:
        return Event(
            EventKind.ELASTIC,
            f"elastic: capacity is back, growing from {describe_layout(running)} to "
            f"{describe_layout(self.full)} from a checkpoint",
            {"dp_from": running.parallel.dp, "dp_to": self.full.parallel.dp},
        )
