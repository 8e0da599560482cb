"""The storage tier: checkpoints on a filesystem or object store, every
`checkpoint.every_steps`, and the restore that takes the newest checkpoint of either
tier that verifies (a snapshot of the memory tier, or one of these)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from shardline.workers.contract.events import RESTORED_METRICS, Event, EventKind
from shardline.workers.engine.checkpoint.memory_tier import MemoryTier
from shardline.workers.engine.checkpoint.tier import Candidate, CheckpointTier, dcp_reader
from shardline.workers.storage.checkpoints import CheckpointStore, CommittedCheckpoint
from shardline.workers.storage.layout import CheckpointLocations


class StorageTier(CheckpointTier):
    """Saves into the job's checkpoint folder (none: restore only); restores from any."""

    def candidates(self, where: CheckpointLocations, memory: MemoryTier | None) -> list[Candidate]:
        """Checkpoints to try, best first, agreed by every rank (rank 0 lists storage; the
        nodes' leaders list their snapshots). A snapshot comes with the moves that give
        every node all its files."""
        found: list[Any] = [None]
        if self.rank == 0:
            listed = []
            for source in where.restore_from:
                store = CheckpointStore(source.url)
                for ckpt in store.committed():
                    if source.accepts(ckpt.step):
                        listed.append((source.url, ckpt))
                if listed:  # the first source that has any wins (own folder, then resume_from)
                    break
            found[0] = listed
        dist.broadcast_object_list(found, src=0, group=self.group)
        out: list[Candidate] = [(CheckpointStore(url), ckpt, None) for url, ckpt in found[0]]
        if memory is not None and memory.spread is not None and memory.store is not None:
            # The job's own snapshots compete with its checkpoints by step; on a tie the
            # snapshot wins (host memory reads faster). The sort is stable.
            snapshots = memory.spread.candidates()
            out = [(memory.store, ckpt, plan) for ckpt, plan in snapshots] + out
            out.sort(key=lambda found: found[1].step, reverse=True)
        return out

    def restore(
        self,
        where: CheckpointLocations,
        make_state: Callable[[dict[str, Any]], dict[str, torch.Tensor]],
        memory: MemoryTier | None = None,
    ) -> tuple[CommittedCheckpoint, dict[str, torch.Tensor]] | None:
        """Load the newest checkpoint (of this tier's sources, or `memory`'s snapshots) that
        verifies into the tensors of `make_state(its manifest)` (in place); returns it and
        the state, or None where there is none."""
        for store, ckpt, moves in self.candidates(where, memory):
            if moves is not None and memory is not None and memory.spread is not None:
                try:  # every rank raises together (SnapshotSpread.move)
                    memory.spread.fill(ckpt, moves)
                    problem = self._verify(store, ckpt)
                except OSError as err:
                    problem = str(err)
            else:
                problem = self._verify(store, ckpt)
            if problem is not None:
                self.on_event(
                    Event(
                        EventKind.CHECKPOINT_SKIPPED,
                        f"checkpoint step {ckpt.step} skipped: {problem}",
                        {"step": ckpt.step, "path": ckpt.path, "problem": problem},
                    )
                )
                continue
            start = time.perf_counter()
            state = make_state(ckpt.manifest)
            dcp.load(state, storage_reader=dcp_reader(store, ckpt.path), process_group=self.group)
            self.restored_step = ckpt.step
            tier = "storage" if moves is None else "memory"
            data = {"step": ckpt.step, "path": ckpt.path, "tier": tier}
            logged = ckpt.manifest.get("trainer", {}).get(RESTORED_METRICS)
            if logged is not None:  # for the relay, which records them if nobody had
                data[RESTORED_METRICS] = logged
            self.on_event(
                Event(
                    EventKind.RESTORED,
                    f"restored checkpoint step {ckpt.step} ({ckpt.manifest.get('layout', '?')}) "
                    f"from {tier} in {time.perf_counter() - start:.2f}s",
                    data,
                )
            )
            return ckpt, state
        return None

    def _verify(self, store: CheckpointStore, ckpt: CommittedCheckpoint) -> str | None:
        """Every rank checks its share of the files; the first problem any rank found."""
        names = sorted(ckpt.manifest["files"])[self.rank :: self.world]
        problems: list[Any] = [None] * self.world
        dist.all_gather_object(problems, store.verify(ckpt, names), group=self.group)
        return next((p for p in problems if p is not None), None)
