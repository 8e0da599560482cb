"""Where a job's in-memory snapshots live on a node, and removing them when it ends.

A snapshot is a folder in host memory (/dev/shm, a tmpfs) that outlives the worker which
wrote it; the engine writes it (workers/engine/checkpoint/). Every rank writes its shards
into the same folder and rank 0 commits it, so the folder must be one folder for the whole
world: the worker group turns snapshots on only when all ranks share one host.

No torch here: the supervisor imports it.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# The operator may point it elsewhere (it must be host memory to be worth it).
ROOT_ENV = "SHARDLINE_SNAPSHOT_ROOT"


def snapshot_root() -> Path:
    """Host memory where there is a tmpfs for it, else the temp folder."""
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "shardline-snapshots"


def snapshot_dir(job_id: str) -> Path:
    return snapshot_root() / job_id


def remove_snapshots(job_id: str) -> bool:
    """Remove the job's snapshots on this node; whether there were any."""
    folder = snapshot_dir(job_id)
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    log.info("removed the in-memory snapshots of job %s at %s", job_id, folder)
    return True
