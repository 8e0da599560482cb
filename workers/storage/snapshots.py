"""Host memory for a job's in-memory snapshots, and removing them when the job ends.

A snapshot is a folder in host memory (/dev/shm, a tmpfs) that outlives the worker which
wrote it; the engine writes it (workers/engine/checkpoint/). The ranks of one node write
into its folder; on several nodes each node's folder also holds a copy of another's
(workers/storage/snapshot_spread.py).

No torch here: the runtime removes snapshots on every node a job used.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import stat
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
    # One root per user: /dev/shm is shared by every local user, and two users' services
    # on one machine must not meet in (or be refused by) one folder.
    return base / f"shardline-snapshots-{os.getuid()}"


class SnapshotFolderRefused(RuntimeError):
    """A snapshot folder this user does not hold alone: another local user could read the
    model's state from it or redirect what is written there."""


def private_snapshot_dir(folder: Path) -> Path:
    """A job's snapshot folder, made where missing, inside a root only this user may enter
    (0700): a snapshot is the model's whole state, and /dev/shm is writable by every local
    user, who could otherwise make the root first, or swap a job's folder for a link to
    their own. Neither the root nor the job's folder is ever reached through a link."""
    folder.parent.parent.mkdir(parents=True, exist_ok=True)
    for path in (folder.parent, folder):
        with contextlib.suppress(FileExistsError):  # checked below, whoever made it
            path.mkdir(mode=0o700)
        _held_alone(path)
    return folder


def _held_alone(path: Path) -> None:
    """Refuse `path` unless it is a real folder (not a link) owned by this user; its mode
    is made 0700 where it was left wider (an older version made the root 0755). Checked
    and changed through one descriptor opened without following a link, so the folder
    cannot be swapped between the check and the change."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:  # ELOOP for a link, ENOTDIR for a file
        raise SnapshotFolderRefused(
            f"the snapshot folder {path} is not a folder but a link or a file: remove it, "
            f"or set {ROOT_ENV} to a folder of this user's own"
        ) from err
    try:
        found = os.fstat(fd)
        if found.st_uid != os.getuid():
            raise SnapshotFolderRefused(
                f"the snapshot folder {path} belongs to user {found.st_uid}, not to this "
                f"service's user ({os.getuid()}): remove it, or set {ROOT_ENV} to a folder "
                "of this user's own"
            )
        if stat.S_IMODE(found.st_mode) != 0o700:
            os.fchmod(fd, 0o700)
    finally:
        os.close(fd)


def remove_snapshot_dir(folder: Path) -> bool:
    """Remove one job's snapshots on this node; whether there were any. A link where the
    folder was is removed itself: nothing it points to is touched."""
    try:
        found = os.lstat(folder)
    except FileNotFoundError:
        return False
    if stat.S_ISDIR(found.st_mode):
        shutil.rmtree(folder, ignore_errors=True)  # never follows a link inside
    else:
        folder.unlink(missing_ok=True)
    log.info("removed the in-memory snapshots at %s", folder)
    return True
