"""What both tiers of checkpoints (storage, host memory) do alike: saving a rank's
training state with torch.distributed.checkpoint (DCP) and committing it.

Every rank writes only its own shards; nothing is gathered onto one rank. Keys are the
model's own parameter names (`model.<name>`, `optim.<name>.<key>`), the same in every
layout, so DCP reshards any checkpoint into any other layout on load. The DCP files hold
tensors only; the trainer's small state (step, loss scaler, RNG) travels as JSON in the
manifest, so restoring never unpickles anything (workers/storage/checkpoints.py commits).

With async saves the loop blocks only while the state is copied to host memory (pinned on
GPU); the write, the checksums and the commit go on in a thread, over a process group of
their own, while training continues. At most one save is in flight.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
from torch.distributed.tensor import DTensor

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.engine.checkpoint.spread import SnapshotSpread
from shardline.workers.storage.checkpoints import CheckpointStore, CommittedCheckpoint
from shardline.workers.storage.snapshot_spread import Transfer, written_by

log = logging.getLogger(__name__)

EventSink = Callable[[Event], None]
CommitSink = Callable[[dict[str, Any]], None]
# A checkpoint to restore, from its store; a snapshot's with the moves between nodes that
# must come first (None: a storage checkpoint, which every rank reads where it is).
Candidate = tuple[CheckpointStore, CommittedCheckpoint, list[Transfer] | None]


def dcp_writer(store: CheckpointStore, path: str) -> Any:
    if store.atomic_rename:
        return FileSystemWriter(path, single_file_per_rank=True)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    return FsspecWriter(store.writer_url(path), single_file_per_rank=True, sync_files=False)


def dcp_reader(store: CheckpointStore, path: str) -> Any:
    if store.atomic_rename:
        return FileSystemReader(path)
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader(store.writer_url(path))


class CheckpointTier:
    """Saves into one CheckpointStore (the storage and memory tiers are its two kinds:
    storage_tier.py, memory_tier.py)."""

    kind = "checkpoint"  # in what it says

    def __init__(
        self,
        store: CheckpointStore | None,
        *,
        keep_last: int,
        async_save: bool,
        info: dict[str, Any],
        on_event: EventSink,
        on_commit: CommitSink | None = None,
    ) -> None:
        self.store = store
        self.keep_last = keep_last
        self.async_save = async_save
        self.info = info  # layout, spec hash, versions: written into every manifest
        self.on_event = on_event
        self.on_commit = on_commit
        self.rank = dist.get_rank()
        self.world = dist.get_world_size()
        # Saves talk over their own group so an async save never shares a collective
        # stream with training.
        self.group = dist.new_group(backend="gloo")
        self.restored_step: int | None = None
        self._pending: threading.Thread | None = None
        self._staged: dict[str, torch.Tensor] = {}
        self.spread = self._spread()
        # Who commits into its folder: rank 0 alone, or each node's leader for snapshots.
        self.committer = self.rank == 0 if self.spread is None else self.spread.leader
        if store is not None:
            if self.committer:
                store.clear_staging()
            dist.barrier(group=self.group)

    def _spread(self) -> SnapshotSpread | None:
        """Copies between nodes of what each node's ranks wrote (the memory tier's)."""
        return None

    def _before_write(self) -> None:
        """First thing in a save's write, on every rank (off the training thread where
        the save is async)."""

    def _after_write(self, step: int, staging: str) -> None:
        """Every rank has written its files of `step` into `staging`."""

    def _said_failed(self, event: Event) -> None:
        """A save in the background failed (training goes on; the next one retries)."""
        self.on_event(event)

    # -- saving ------------------------------------------------------------------------

    def save(
        self, step: int, state: dict[str, torch.Tensor], trainer_state: dict[str, Any]
    ) -> float:
        """Save `state` as the checkpoint of `step`; returns the seconds training was held."""
        assert self.store is not None, "no checkpoint folder to save into"
        start = time.perf_counter()
        self.wait()
        if not self.async_save:
            self._write(step, state, trainer_state, start, None)
            return time.perf_counter() - start
        staged = self._stage(state)
        blocking = time.perf_counter() - start
        self._pending = threading.Thread(
            target=self._write_in_background,
            args=(step, staged, trainer_state, start, blocking),
            name=f"checkpoint-step-{step}",
            daemon=True,
        )
        self._pending.start()
        return blocking

    def in_flight(self) -> list[threading.Thread]:
        """The save being written in the background, if one is."""
        return [self._pending] if self._pending is not None and self._pending.is_alive() else []

    def wait(self) -> None:
        """Until the save in flight (if any) has committed or failed."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None

    def _stage(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Host copies of `state`, in buffers kept from one save to the next."""
        pin = torch.cuda.is_available()
        staged: dict[str, torch.Tensor] = {}
        for key, value in state.items():
            local = value.to_local() if isinstance(value, DTensor) else value
            buf = self._staged.get(key)
            if buf is None or buf.shape != local.shape or buf.dtype != local.dtype:
                buf = torch.empty(local.shape, dtype=local.dtype, device="cpu", pin_memory=pin)
                self._staged[key] = buf
            buf.copy_(local, non_blocking=pin)
            if isinstance(value, DTensor):
                staged[key] = DTensor.from_local(
                    buf,
                    value.device_mesh,
                    value.placements,
                    run_check=False,
                    shape=value.shape,
                    stride=value.stride(),
                )
            else:
                staged[key] = buf
        if pin:
            torch.cuda.synchronize()
        return staged

    def _write_in_background(self, *args: Any) -> None:
        try:
            self._write(*args)
        except Exception as err:  # a failed save must not kill training; the next retries
            log.exception("checkpoint save failed")
            said = Event(
                EventKind.SAVE_FAILED,
                f"{self.kind} save of step {args[0]} failed: {err}",
                {"step": args[0]},
            )
            self._said_failed(said)
            if self.store is not None and self.committer:  # host memory is scarce
                with contextlib.suppress(OSError):
                    self.store.fs.rm(self.store.staging_path(args[0]), recursive=True)

    def _write(
        self,
        step: int,
        state: dict[str, torch.Tensor],
        trainer_state: dict[str, Any],
        start: float,
        blocking: float | None,
    ) -> None:
        store = self.store
        assert store is not None
        self._before_write()
        staging = store.staging_path(step)
        dcp.save(state, storage_writer=dcp_writer(store, staging), process_group=self.group)
        mine = [n for n in store.files_in(staging) if written_by(n) == self.rank]
        sums = store.checksums(staging, mine)
        self._after_write(step, staging)
        gathered: list[Any] | None = [None] * self.world if self.rank == 0 else None
        dist.gather_object(sums, gathered, dst=0, group=self.group)
        files: dict[str, dict[str, Any]] = {}
        for rank, part in enumerate(gathered or []):
            for name, entry in part.items():
                files[name] = {**entry, "rank": rank}
        total = time.perf_counter() - start
        blocking_s = total if blocking is None else blocking
        meta = {
            **self.info,
            "trainer": trainer_state,
            "world_size": self.world,
            "save_s": total,
            "blocking_s": blocking_s,
            # Which save: nodes that hold the same step from different timelines (a
            # node that left the world and came back) do not mix their files.
            "save_id": uuid.uuid4().hex,
        }
        if self.spread is not None and self.spread.groups.spread:
            # Every node's leader commits the same manifest into its own folder.
            payload: list[Any] = [files, meta]
            dist.broadcast_object_list(payload, src=0, group=self.group)
            files, meta = payload
        if not self.committer:
            return
        ckpt = store.commit(step, files, meta)
        protect = {self.restored_step} if self.restored_step is not None else set()
        deleted = store.prune(self.keep_last, protect)
        if self.rank != 0:
            return
        summary = {
            "step": step,
            "path": ckpt.path,
            "bytes": ckpt.bytes,
            "layout": self.info.get("layout", ""),
            "save_s": total,
            "blocking_s": blocking_s,
            "deleted": deleted,
        }
        self.on_event(
            Event(
                EventKind.CHECKPOINT_COMMITTED,
                f"{self.kind} step {step} committed: {ckpt.bytes} bytes, "
                f"{total:.2f}s to save, training held {blocking_s:.3f}s",
                summary,
            )
        )
        if self.on_commit is not None:
            self.on_commit(summary)
