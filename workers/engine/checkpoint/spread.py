"""In-memory snapshots of a world that spans several nodes: each node's folder holds its
own ranks' files and a copy of the previous node's, and a restore first gives every node
all the files of the step it restores (workers/storage/snapshot_spread.py plans both).

The bytes move over the tier's own gloo group, rank to rank, one file at a time in an
order every rank computes alike, so no two ranks wait on each other in a cycle. No Ray:
`shardline train` on several hosts spreads its snapshots the same way.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Any, BinaryIO

import torch
import torch.distributed as dist

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.storage.checkpoints import MANIFEST, CheckpointStore, CommittedCheckpoint
from shardline.workers.storage.snapshot_spread import (
    FolderGroups,
    Listing,
    Transfer,
    folder_identity,
    replication_plan,
    restore_plan,
)

log = logging.getLogger(__name__)

_CHUNK = 64 << 20  # bytes per message: a file never sits whole in a second buffer


class SnapshotSpread:
    """The folder groups of one memory tier, and the moves between them."""

    def __init__(self, store: CheckpointStore, group: Any) -> None:
        self.store = store
        self.group = group
        self.rank = dist.get_rank()
        identities: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(identities, folder_identity(Path(store.root)), group=group)
        self.groups = FolderGroups.from_identities(identities)
        self.leader = self.groups.is_leader(self.rank)
        if self.groups.spread and self.rank == 0:
            log.info("snapshots in %d folders: ranks %s", len(self.groups.groups), self.groups)

    # -- after a save --------------------------------------------------------------------

    def replicate(self, staging: str) -> None:
        """Every rank, once DCP has written `staging` on every node: each node's files to
        the next node (nothing where the world shares one folder)."""
        if not self.groups.spread:
            return
        mine = self.store.files_in(staging) if self.leader else []
        listed: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(listed, mine, group=self.group)
        names = sorted({name for names in listed for name in names})
        self.move(replication_plan(self.groups, names), staging)

    def memory_event(self, step: int, staging: str) -> Event | None:
        """Every rank: what each node's folder holds of the snapshot in `staging` (its own
        ranks' files and the copy of its peer's); rank 0 gets it as an event."""
        held = 0
        if self.leader:
            held = sum(
                os.path.getsize(os.path.join(staging, name))
                for name in self.store.files_in(staging)
            )
        gathered: list[Any] | None = [None] * dist.get_world_size() if self.rank == 0 else None
        dist.gather_object(held, gathered, dst=0, group=self.group)
        if gathered is None:
            return None
        folders = [list(group) for group in self.groups.groups]
        bytes_held = [gathered[leader] for leader in self.groups.leaders]
        parts = ", ".join(
            f"ranks {','.join(map(str, g))}: {b / 2**20:.1f} MiB"
            for g, b in zip(folders, bytes_held, strict=True)
        )
        return Event(
            EventKind.SNAPSHOT_MEMORY,
            f"in-memory snapshots on {len(folders)} node(s), per snapshot ({parts}); a node "
            "holds the newest committed one and at most one being written",
            {"step": step, "folders": folders, "bytes": bytes_held},
        )

    # -- before a restore ----------------------------------------------------------------

    def candidates(self) -> list[tuple[CommittedCheckpoint, list[Transfer]]]:
        """Every rank: the snapshot steps the live nodes hold whole between them, newest
        first, each as this rank's folder will hold it and with the moves that fill every
        node's folder."""
        found: list[Listing] = []
        if self.leader:
            for ckpt in self.store.committed():
                present = frozenset(self.store.files_in(ckpt.path)) - {MANIFEST}
                found.append(Listing(ckpt.step, ckpt.manifest, present))
        listed: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(listed, found, group=self.group)
        listings = {leader: listed[leader] for leader in self.groups.leaders}
        return [
            (CommittedCheckpoint(m["step"], self.store.final_path(m["step"]), m), plan)
            for m, plan in restore_plan(self.groups, listings)
        ]

    def forget_after(self, step: int) -> None:
        """Leaders: drop committed snapshots newer than `step`, the step the run restored
        (0: none). They belong to a timeline given up; kept, they would outrank (and have
        pruned) every snapshot of this one."""
        if not self.leader:
            return
        for ckpt in self.store.committed():
            if ckpt.step > step:
                with contextlib.suppress(OSError):
                    self.store.fs.rm(f"{ckpt.path}/{MANIFEST}")
                    self.store.fs.rm(ckpt.path, recursive=True)
                log.info(
                    "dropped snapshot step %d, newer than the restored step %d", ckpt.step, step
                )

    def fill(self, ckpt: CommittedCheckpoint, plan: list[Transfer]) -> None:
        """Every rank: move `plan`'s files, then commit the step where a node lacked it."""
        if not plan:
            return
        self.move(plan, ckpt.path)
        receivers = {t.dst for t in plan}
        if self.rank in receivers and not os.path.exists(os.path.join(ckpt.path, MANIFEST)):
            self.store.write_manifest(ckpt.path, ckpt.manifest)
        log.info("snapshot step %d: %d files moved between nodes", ckpt.step, len(plan))
        dist.barrier(group=self.group)

    # -- moving bytes ----------------------------------------------------------------------

    def move(self, plan: list[Transfer], folder: str) -> None:
        """Every rank: copy each planned file from its sender's `folder` into its
        receiver's (the same path on every node). A rank that cannot read or write a file
        keeps the exchange in step (a sender sends nothing, a receiver drains what comes)
        and every rank raises together at the end, so no peer waits for ever on it."""
        problem = None
        for transfer in plan:
            if transfer.src == self.rank:
                problem = self._send(os.path.join(folder, transfer.name), transfer.dst) or problem
            elif transfer.dst == self.rank:
                path = os.path.join(folder, transfer.name)
                problem = self._receive(path, transfer.src) or problem
        problems: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(problems, problem, group=self.group)
        found = next((p for p in problems if p is not None), None)
        if found is not None:
            raise OSError(f"moving snapshot files between nodes failed: {found}")

    def _send(self, path: str, dst: int) -> str | None:
        """Send one file; what went wrong here, if anything (the receiver gets size -1)."""
        try:
            f = open(path, "rb")  # noqa: SIM115 (closed below; a failure must still send)
            size = os.fstat(f.fileno()).st_size
        except OSError as err:
            dist.send(torch.tensor([-1], dtype=torch.int64), dst, group=self.group)
            return f"rank {self.rank} could not read {path}: {err}"
        dist.send(torch.tensor([size], dtype=torch.int64), dst, group=self.group)
        with f:
            left = size
            while left > 0:  # exactly `size` bytes, as promised: zeros where a read fell short
                data = f.read(min(left, _CHUNK))
                chunk = bytearray(data.ljust(min(left, _CHUNK), b"\0"))
                dist.send(torch.frombuffer(chunk, dtype=torch.uint8), dst, group=self.group)
                left -= len(chunk)
        return None

    @staticmethod
    def _open_for_writing(path: str) -> BinaryIO:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        return open(path, "wb")  # the caller closes it, after the drain

    def _receive(self, path: str, src: int) -> str | None:
        """Receive one file; what went wrong here or at the sender, if anything."""
        size = torch.empty(1, dtype=torch.int64)
        dist.recv(size, src, group=self.group)
        left = int(size.item())
        if left < 0:
            return f"rank {src} could not send {os.path.basename(path)}"
        partial = f"{path}.partial"
        problem = None
        out = None
        try:
            out = self._open_for_writing(partial)
        except OSError as err:
            problem = f"rank {self.rank} could not write {path}: {err}"
        while left > 0:  # drained even when it cannot be written
            chunk = torch.empty(min(left, _CHUNK), dtype=torch.uint8)
            dist.recv(chunk, src, group=self.group)
            left -= chunk.numel()
            if out is not None and problem is None:
                try:
                    out.write(chunk.numpy().tobytes())
                except OSError as err:  # a full /dev/shm
                    problem = f"rank {self.rank} could not write {path}: {err}"
        if out is not None:
            out.close()
        if problem is None:
            os.replace(partial, path)  # a half-received file is never taken for the whole
        else:
            with contextlib.suppress(OSError):
                os.remove(partial)
        return problem
