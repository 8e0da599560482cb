"""Reading a committed checkpoint in one process, without a world: for export and
`shardline generate`."""

from __future__ import annotations

import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp

from shardline.workers.engine.checkpoint.tier import dcp_reader
from shardline.workers.storage.checkpoints import MANIFEST, CheckpointStore, CommittedCheckpoint


class UnreadableCheckpoint(ValueError):
    """A path that is not a committed, intact checkpoint; the message says which and why."""


def open_checkpoint(path: str) -> CommittedCheckpoint:
    """The committed, verified checkpoint at `path` (a `step-<n>` folder)."""
    if "://" not in path:
        path = str(Path(path).resolve())
    parent, _, name = path.rstrip("/").rpartition("/")
    store = CheckpointStore(parent or ".")
    ckpt = next((c for c in store.committed() if c.path.rstrip("/").endswith(name)), None)
    if ckpt is None:
        raise UnreadableCheckpoint(f"{path} is not a committed checkpoint (no {MANIFEST} in it)")
    problem = store.verify(ckpt, sorted(ckpt.manifest["files"]))
    if problem is not None:
        raise UnreadableCheckpoint(f"checkpoint {path} is damaged: {problem}")
    return ckpt


def read_model_state(ckpt: CommittedCheckpoint) -> dict[str, torch.Tensor]:
    """Whole `model.*` tensors of a checkpoint, by the model's own names, in one process."""
    store = CheckpointStore(ckpt.path.rpartition("/")[0] or ".")
    reader = dcp_reader(store, ckpt.path)
    metadata = reader.read_metadata()
    state: dict[str, torch.Tensor] = {}
    for key, meta in metadata.state_dict_metadata.items():
        if key.startswith("model.") and hasattr(meta, "size"):
            state[key] = torch.empty(tuple(meta.size), dtype=meta.properties.dtype)
    with warnings.catch_warnings():
        # DCP warns that no process group exists: reading in one process is the intent.
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(state, storage_reader=reader, no_dist=True)
    return {key.removeprefix("model."): value for key, value in state.items()}
