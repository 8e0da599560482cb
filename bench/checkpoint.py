"""Checkpoint save and restore throughput next to the raw disk, in one run; one JSON line.

    .venv/bin/python -m bench.checkpoint [--dim 1024] [--layers 8] [--dir /path/on/disk]

One process builds a model with AdamW state (one training step; on the GPU where there is
one), then, in the same folder:
- writes and fsyncs the same number of bytes sequentially (the disk's raw write), and reads
  them back (raw read), before and after the checkpoints, keeping the faster of each;
- saves a synchronous checkpoint (DCP write, fsync, checksums, manifest, commit) and
  restores it (verify every file, DCP load into the live tensors);
- saves asynchronously twice and reports how long training was held (the first save
  allocates its host buffers, later ones reuse them), next to the synchronous save's time.
Reads come right after writes in both cases, so both may be served from the page cache:
the comparison is like for like, not a cold-disk figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from shardline.workers.contract.net import free_port
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.checkpoint.state import ModelAndOptimizer, OptimizerState
from shardline.workers.engine.checkpoint.storage_tier import StorageTier
from shardline.workers.engine.distributed import init_world, leave_world, pick_device
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore, RestoreSource
from shardline.workers.storage.layout import CheckpointLocations

CHUNK = 8 << 20


def raw_write_read(folder: Path, nbytes: int) -> tuple[float, float]:
    """Seconds to write (with fsync) and read back `nbytes` sequentially."""
    block = os.urandom(CHUNK)
    path = folder / "raw.bin"
    start = time.perf_counter()
    with path.open("wb") as f:
        left = nbytes
        while left > 0:
            left -= f.write(block[: min(left, CHUNK)])
        f.flush()
        os.fsync(f.fileno())
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    with path.open("rb") as f:
        while f.read(CHUNK):
            pass
    read_s = time.perf_counter() - start
    path.unlink()
    return write_s, read_s


def build(dim: int, layers: int, device: torch.device) -> Trainer:
    spec = JobSpec.model_validate(
        {
            "name": "bench-checkpoint",
            "model": {
                "preset": "tiny",
                "dim": dim,
                "n_layers": layers,
                "n_heads": 16,
                "n_kv_heads": 16,
                "vocab_size": 32000,
                "seq_len": 64,
            },
            "train": {"steps": 1, "global_batch_size": 1, "micro_batch_size": 1},
        }
    )
    trainer = Trainer(spec, world_size=1, device=device)
    trainer.train()  # AdamW state exists after one step
    return trainer


def checkpointer(folder: Path, async_save: bool) -> StorageTier:
    return StorageTier(
        CheckpointStore(str(folder)),
        keep_last=10,
        async_save=async_save,
        info={"layout": "bench"},
        on_event=lambda event: None,
    )


def measure(trainer: Trainer, folder: Path) -> dict[str, Any]:
    state = ModelAndOptimizer(
        trainer.parts.modules, OptimizerState(trainer.optimizers)
    ).state_dict()
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    before = raw_write_read(folder, nbytes)

    sync = checkpointer(folder / "sync", async_save=False)
    sync_s = sync.save(1, state, {"step": 1})
    start = time.perf_counter()
    restored = sync.restore(
        CheckpointLocations(restore_from=(RestoreSource(str(folder / "sync")),)),
        lambda manifest: state,
    )
    restore_s = time.perf_counter() - start
    assert restored is not None and restored[0].step == 1

    # The first async save allocates its host buffers; later ones reuse them.
    background = checkpointer(folder / "async", async_save=True)
    first_blocking_s = background.save(1, state, {"step": 1})
    background.wait()
    start = time.perf_counter()
    blocking_s = background.save(2, state, {"step": 2})
    background.wait()
    async_total_s = time.perf_counter() - start
    # The disk's raw speed is measured before and after the saves; the faster of each is
    # the bar (this disk varies over minutes).
    after = raw_write_read(folder, nbytes)
    raw_write_s, raw_read_s = min(before[0], after[0]), min(before[1], after[1])
    gb = nbytes / 1e9
    return {
        "checkpoint_bytes": nbytes,
        "raw_write_GBps": round(gb / raw_write_s, 3),
        "save_GBps": round(gb / sync_s, 3),
        "save_vs_raw_write": round(raw_write_s / sync_s, 3),
        "raw_read_GBps": round(gb / raw_read_s, 3),
        "restore_GBps": round(gb / restore_s, 3),
        "restore_vs_raw_read": round(raw_read_s / restore_s, 3),
        "sync_save_s": round(sync_s, 3),
        "async_first_blocking_s": round(first_blocking_s, 4),
        "async_blocking_s": round(blocking_s, 4),
        "async_total_s": round(async_total_s, 3),
        "async_blocking_vs_sync": round(blocking_s / sync_s, 4),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--dir", default=None, help="folder on the disk to measure")
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="bench-checkpoint-", dir=args.dir))
    device = pick_device(0)  # the GPU where there is one: saves then copy device to host
    init_world(
        rank=0,
        world_size=1,
        master_addr="127.0.0.1",
        master_port=free_port(),
        device=device,
    )
    try:
        trainer = build(args.dim, args.layers, device)
        params = sum(p.numel() for p in trainer.parts.parameters())
        result = {
            "bench": "checkpoint",
            "params": params,
            "device": device.type,
            "folder": str(folder),
            **measure(trainer, folder),
        }
        print(json.dumps(result))
    finally:
        leave_world()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
