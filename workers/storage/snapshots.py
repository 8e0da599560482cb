"""Host memory for a job's in-memory snapshots, and removing them when the job ends.

A snapshot is a folder in host memory (/dev/shm, a tmpfs) that outlives the worker which
wrote it; the engine writes it (workers/engine/checkpoint/). The ranks of one node write
into its folder; on several nodes each node's folder also holds a copy of another's
(workers/storage/snapshot_spread.py).

No torch here: the runtime removes snapshots on every node a job used.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

# An operator may point a node (or `shardline train`) elsewhere; it must be host memory to
# be worth it. The service's setting of the same name goes into every JobLayout instead.
ROOT_ENV = "SHARDLINE_SNAPSHOT_ROOT"


def default_snapshot_root() -> Path:
    """This process's snapshot root: `SHARDLINE_SNAPSHOT_ROOT` where set, else the node's
    host memory where there is a tmpfs for it, else its temp folder."""
    configured = os.environ.get(ROOT_ENV)
    if configured:
        return Path(configured)
    shm = Path("/dev/shm")
    base = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    return base / "shardline-snapshots"


def private_snapshot_dir(folder: Path) -> Path:
    """A job's snapshot folder, made where missing, inside a root only this user may enter
    (0700): a snapshot is the model's whole state, and files written under /dev/shm are
    otherwise readable by every local user."""
    root = folder.parent
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    if root.stat().st_uid == os.getuid():
        os.chmod(root, 0o700)  # also where an older version made it 0755
    folder.mkdir(exist_ok=True, mode=0o700)
    return folder


def remove_snapshot_dir(folder: Path) -> bool:
    """Remove one job's snapshots on this node; whether there were any."""
    if not folder.exists():
        return False
    shutil.rmtree(folder, ignore_errors=True)
    log.info("removed the in-memory snapshots at %s", folder)
    return True
