"""The memory tier: snapshots in host memory that outlives the rank's process (always
async, only the newest kept), copied to a peer node where the world spans several, at
the cadence's steps."""

from __future__ import annotations

import logging
from typing import Any

import torch.distributed as dist

from shardline.workers.contract.events import Event
from shardline.workers.engine.checkpoint.cadence import SnapshotCadence
from shardline.workers.engine.checkpoint.spread import SnapshotSpread
from shardline.workers.engine.checkpoint.tier import CheckpointTier, EventSink
from shardline.workers.storage.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

# One committed snapshot, plus the one being written: host memory holds at most two.
KEEP_SNAPSHOTS = 1


def _log_only(event: Event) -> None:
    # A snapshot every few steps would drown the job's events; the rank's log keeps them.
    log.info("%s", event.message)


class MemoryTier(CheckpointTier):
    """Writes into each node's own host memory (its store's path on every node)."""

    kind = "snapshot"

    def __init__(
        self,
        store: CheckpointStore,
        *,
        info: dict[str, Any],
        on_report: EventSink,
        cadence: SnapshotCadence | None = None,
    ) -> None:
        """`on_report`: the job's events, for what is said once a run (memory per node,
        the first failure); each snapshot's own words go to the rank's log. `cadence`:
        where the interval is "auto", agreed in each snapshot."""
        self.on_report = on_report
        self.cadence = cadence
        self._reported = False  # snapshot memory per node: said once a run
        self._said_failure = False  # a failed snapshot: said once a run
        super().__init__(
            store,
            keep_last=KEEP_SNAPSHOTS,
            async_save=True,  # the step waits only for the copy into host buffers
            info=info,
            on_event=_log_only,
        )

    def _spread(self) -> SnapshotSpread | None:
        assert self.store is not None
        return SnapshotSpread(self.store, self.group)

    def _before_write(self) -> None:
        if self.cadence is not None and self.cadence.fixed is None:
            # Rank 0's next interval, agreed here, first, off the training thread: every
            # rank applies it when it joins this save (workers/engine/checkpoint/cadence.py).
            proposal: list[Any] = [self.cadence.proposal() if self.rank == 0 else None]
            dist.broadcast_object_list(proposal, src=0, group=self.group)
            self.cadence.proposed = int(proposal[0])

    def _after_write(self, step: int, staging: str) -> None:
        assert self.spread is not None
        self.spread.replicate(staging)
        if not self._reported:  # every rank: it is a collective
            self._reported = True
            said = self.spread.memory_event(step, staging)
            if said is not None:
                self.on_report(said)

    def _said_failed(self, event: Event) -> None:
        # A snapshot's failures go to the rank's log, but the first one to the job's
        # events too: one that fails every time (a small /dev/shm) must be seen.
        first = not self._said_failure
        self._said_failure = True
        (self.on_report if first else self.on_event)(event)
