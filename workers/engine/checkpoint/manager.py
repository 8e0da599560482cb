"""The checkpoint manager, in torchtitan's shape: the trainer registers its stateful parts
once, then calls `load()` when it starts, `save(step, last_step=...)` after every step and
`save_on_stop(step)` when asked to stop with a checkpoint; the manager decides when each
tier saves.

Two tiers. Storage: every `checkpoint.every_steps`, on the last step and on a stop that
asks for it, sync or async, keeping `keep_last`. Memory: every `memory_every_steps`, into
host memory that outlives the process (always async, only the newest kept), cheap, lost
only with its node. A restore takes the newest checkpoint of either tier that verifies.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from shardline.workers.contract.events import RESTORED_METRICS
from shardline.workers.contract.sections import CheckpointSpec
from shardline.workers.engine.checkpoint.cadence import SnapshotCadence
from shardline.workers.engine.checkpoint.memory_tier import MemoryTier
from shardline.workers.engine.checkpoint.state import JsonState, TensorState
from shardline.workers.engine.checkpoint.storage_tier import StorageTier
from shardline.workers.engine.checkpoint.tier import CommitSink, EventSink
from shardline.workers.storage.checkpoints import CheckpointStore, CommittedCheckpoint
from shardline.workers.storage.layout import CheckpointLocations
from shardline.workers.storage.snapshots import private_snapshot_dir

log = logging.getLogger(__name__)


class CheckpointManager:
    def __init__(
        self,
        policy: CheckpointSpec,
        where: CheckpointLocations,
        *,
        tensors: TensorState,
        small: dict[str, JsonState],
        info: dict[str, Any],
        on_event: EventSink,
        on_commit: CommitSink | None = None,
        snapshot_multiple_of: int = 1,
        steps_per_call: int = 1,
    ) -> None:
        """`tensors` and `small` are the registry of stateful parts; `info` (layout, spec
        hash, versions) goes into every manifest. Snapshots only at steps that are
        multiples of `snapshot_multiple_of` (local SGD's syncs)."""
        self.cadence = SnapshotCadence(
            policy.memory_every_steps, 0, snapshot_multiple_of, steps_per_call
        )
        self._mark: float | None = None  # when the last save call had joined its snapshot
        self._last_save: str | None = None  # what that call saved: "snapshot", "checkpoint"
        if policy.memory_every_steps == 0:  # no memory tier: nothing to restore from it
            where = replace(where, snapshot_url=None)
        self.policy = policy
        self.where = where
        self.tensors = tensors
        self.small = small
        self.restored: CommittedCheckpoint | None = None
        self.last_saved_step: int | None = None  # the newest step either saved or restored
        self.storage: StorageTier | None = None
        self.memory: MemoryTier | None = None
        if not (where.save_url or where.restore_from or where.snapshot_url):
            return  # nothing to save or restore: no process group of its own either
        self.storage = StorageTier(
            CheckpointStore(where.save_url) if where.save_url else None,
            keep_last=policy.keep_last,
            async_save=policy.async_save,
            info=info,
            on_event=on_event,
            on_commit=on_commit,
        )
        if where.snapshot_url:
            private_snapshot_dir(Path(where.snapshot_url))
            self.memory = MemoryTier(
                CheckpointStore(where.snapshot_url),
                info=info,
                on_report=on_event,
                cadence=self.cadence,
            )

    def load(self) -> int | None:
        """Restore the newest checkpoint of either tier that verifies into the registered
        parts; returns the step it was taken after, or None where there is none."""
        if self.storage is None:
            return None
        found = self.storage.restore(self.where, self.tensors.load_template, self.memory)
        if self.memory is not None and self.memory.spread is not None:
            self.memory.spread.forget_after(0 if found is None else found[0].step)
        if found is None:
            return None
        ckpt, state = found
        self.tensors.load_state_dict(state)
        small = ckpt.manifest["trainer"]
        for name, part in self.small.items():
            if name in small:  # else saved by a job without this part: it starts fresh
                part.load_state_dict(small[name])
        self.restored = ckpt
        self.last_saved_step = int(small["step"])
        self.cadence.restart_at(self.last_saved_step)
        return self.last_saved_step

    def save(
        self, step: int, *, last_step: bool = False, logged: dict[str, Any] | None = None
    ) -> dict[str, float]:
        """After training `step` (`last_step`: the run's last): a storage checkpoint where
        the policy says, else a snapshot where one is due. Returns the seconds training
        was held, named as the step's metrics name them.

        `logged`: the step's metrics where it is a logged step. They go into what is saved:
        a save may commit before rank 0 hands them on, and a world restored from it trains
        on after this step and never logs it again (the restore event carries them)."""
        if self.memory is not None:
            # A snapshot overlaps one step at most: once this step is done, so is the
            # previous snapshot, and a death loses at most memory_every_steps steps.
            self.memory.wait()
            self._time_step(step)
        if self._storage_due(step, last_step):
            self._last_save = "checkpoint"
            return {"checkpoint_blocking_s": self.save_now(step, logged)}
        if self.memory is not None and self.cadence.due(step):
            self._last_save = "snapshot"
            self.cadence.taken(step)
            held = self.memory.save(step, self.tensors.state_dict(), self._small(step, logged))
            return {"snapshot_blocking_s": held}
        self._last_save = None
        return {}

    def due(self, step: int, *, last_step: bool = False) -> bool:
        """Whether the save call after `step` may save. Until the last snapshot has
        joined (in that call) its successor's step is not known: then yes."""
        if self._storage_due(step, last_step):
            return True
        return self.memory is not None and self.cadence.due(step)

    def _time_step(self, step: int) -> None:
        """The cadence's clock: from the last save call's join to this one's (a step,
        what that call saved, and any wait for a snapshot to commit)."""
        self.cadence.joined()
        now = time.perf_counter()
        if self._mark is not None:
            self.cadence.step_timed(step, now - self._mark, self._last_save)
        self._mark = now

    def save_on_stop(self, step: int) -> None:
        """A stop that asks for a checkpoint (a pause, a grow-back): to storage, unless this
        step is saved already; never a snapshot."""
        if self._storage_due(step, last_step=True):
            self.save_now(step)

    def save_now(self, step: int, logged: dict[str, Any] | None = None) -> float:
        """A storage checkpoint of `step` (with its metrics where `logged`), whatever the
        policy says; returns the seconds training was held."""
        if self.storage is None or self.storage.store is None:
            raise RuntimeError("this run has no checkpoint folder to save into")
        held = self.storage.save(step, self.tensors.state_dict(), self._small(step, logged))
        self.last_saved_step = step
        return held

    def _storage_due(self, step: int, last_step: bool) -> bool:
        saves = self.storage is not None and self.storage.store is not None
        if not saves or step == 0 or step == self.last_saved_step:
            return False
        every = self.policy.every_steps
        return last_step or (every > 0 and step % every == 0)

    def _small(self, step: int, logged: dict[str, Any] | None) -> dict[str, Any]:
        small = {"step": step, **{name: part.state_dict() for name, part in self.small.items()}}
        if logged is not None:
            # A copy: the trainer adds the save's own figures to its dict afterwards.
            small[RESTORED_METRICS] = dict(logged)
        return small

    def in_flight(self) -> list[threading.Thread]:
        """The saves being written in the background (to wait for without the manager)."""
        return [t for tier in (self.storage, self.memory) if tier for t in tier.in_flight()]

    def wait(self) -> None:
        """Until every save in flight has committed or failed."""
        for tier in (self.storage, self.memory):
            if tier is not None:
                tier.wait()
