"""The in-memory tier of checkpoints: a DCP save into a folder in host memory.

The folder (on /dev/shm, see workers/storage/snapshots.py) belongs to the node, not to the
process, so a snapshot outlives the worker that wrote it: a killed rank costs at most
`checkpoint.memory_every_steps` steps. It reuses the storage tier's machinery (async
staging, per-file checksums, a manifest committed by one atomic rename, resharding on
load), so a snapshot restores into any layout, and keeps only the newest one.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from workers.engine.checkpoint.tier import Checkpointer, CheckpointPlan
from workers.storage.checkpoints import CheckpointStore

log = logging.getLogger(__name__)

# One committed snapshot, plus the one being written: host memory holds at most two.
KEEP_SNAPSHOTS = 1


def _log_only(message: str, data: dict[str, Any]) -> None:
    # A snapshot every few steps would drown the job's events; the rank's log keeps them.
    log.info("%s", message)


class SnapshotTier:
    """Saves a snapshot every `plan.snapshot_every_steps` steps, asynchronously."""

    def __init__(self, plan: CheckpointPlan, info: dict[str, Any]) -> None:
        assert plan.snapshot_url is not None
        self.every_steps = plan.snapshot_every_steps
        self.checkpointer = Checkpointer(
            CheckpointStore(plan.snapshot_url),
            keep_last=KEEP_SNAPSHOTS,
            async_save=True,  # the step waits only for the copy into host buffers
            info=info,
            on_event=_log_only,
            kind="snapshot",
        )

    def due(self, step: int) -> bool:
        return self.every_steps > 0 and step % self.every_steps == 0

    def save(
        self, step: int, state: dict[str, torch.Tensor], trainer_state: dict[str, Any]
    ) -> float:
        """Snapshot the state after `step`; returns the seconds training was held."""
        return self.checkpointer.save(step, state, trainer_state)

    def wait(self) -> None:
        self.checkpointer.wait()
