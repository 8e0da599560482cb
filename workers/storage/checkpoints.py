"""Where a job's checkpoints live, and what makes one committed.

A checkpoint is written into a staging folder. When every rank has written its shards,
rank 0 writes `manifest.json` (every file with its size and a checksum computed by the
rank that wrote it, the step, the layout, the trainer's small state) and makes the
checkpoint visible: on a local filesystem by one atomic rename of the folder; on an object
store (no atomic rename) by moving the shards first and writing the manifest last. Either
way a checkpoint is committed exactly when its manifest is in place, and only committed
checkpoints are listed, restored or counted.

No torch here: the control plane lists checkpoints through this module too.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

from shardline.workers.storage.limits import install_from_env

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FORMAT = 1
_COMMITTED = re.compile(r"^step-(\d+)$")
# A pin keeps a committed checkpoint from retention while something reads it (an export):
# a file in PINS named for the step and the time it lapses, so a reader that dies leaves
# no checkpoint kept forever.
PINS = ".pins"
_PIN = re.compile(r"^step-(\d+)\.until-(\d+)\.[0-9a-f]+$")
_CHUNK = 8 << 20


@dataclass(frozen=True)
class RestoreSource:
    """A checkpoints folder a run may start from: a given step, or (None) the newest."""

    url: str
    step: int | None = None

    def accepts(self, step: int) -> bool:
        return self.step is None or step == self.step


@dataclass(frozen=True)
class CommittedCheckpoint:
    step: int
    path: str
    manifest: dict[str, Any]

    @property
    def bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.manifest["files"].values())


def checksum(fs: Any, path: str) -> tuple[int, str]:
    """(size, crc32 as hex) of one file, read in chunks."""
    crc, size = 0, 0
    with fs.open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            size += len(chunk)
    return size, f"{crc:08x}"


class CheckpointStore:
    """The checkpoints folder of one job (a local path or an fsspec URL)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        remote = "://" in self.url and not self.url.startswith("file://")
        if remote:
            install_from_env()  # in a supervisor or a rank: the control plane's limits
        # An object store's listings must be read fresh: other ranks and processes commit.
        self.fs, self.root = url_to_fs(
            self.url, **({"use_listings_cache": False} if remote else {})
        )
        self.atomic_rename = isinstance(self.fs, LocalFileSystem)

    def _join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def staging_path(self, step: int) -> str:
        return self._join(f".staging-step-{step:08d}")

    def final_path(self, step: int) -> str:
        return self._join(f"step-{step:08d}")

    def writer_url(self, path: str) -> str:
        """The URL form of a path of this store, for DCP's readers and writers."""
        if self.atomic_rename or "://" in path:
            return path
        protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        return f"{protocol}://{path}"

    # -- reading ---------------------------------------------------------------------

    def committed(self) -> list[CommittedCheckpoint]:
        """Committed checkpoints, newest first. A folder without a readable manifest is not
        one (a save still moving into place, or one that died half-way)."""
        if not self.fs.exists(self.root):
            return []
        found = []
        for entry in self.fs.ls(self.root, detail=False):
            name = entry.rstrip("/").rsplit("/", 1)[-1]
            match = _COMMITTED.match(name)
            if not match:
                continue
            manifest = self._read_manifest(self._join(name))
            if manifest is not None:
                # The URL on an object store ("s3://bucket/..."): a reader in another
                # process (an export, the API's listing) must know which filesystem.
                path = self.writer_url(self._join(name))
                found.append(CommittedCheckpoint(int(match.group(1)), path, manifest))
        return sorted(found, key=lambda c: c.step, reverse=True)

    def _read_manifest(self, folder: str) -> dict[str, Any] | None:
        try:
            with self.fs.open(f"{folder}/{MANIFEST}", "r") as f:
                manifest = json.load(f)
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
            return None
        return manifest

    def find(self, step: int | None = None) -> CommittedCheckpoint | None:
        """The committed checkpoint of `step`, or the newest one."""
        for ckpt in self.committed():
            if step is None or ckpt.step == step:
                return ckpt
        return None

    def verify(self, ckpt: CommittedCheckpoint, names: list[str]) -> str | None:
        """Check `names` (some of the manifest's files) against it; the first problem found,
        naming the file, or None."""
        for name in names:
            want = ckpt.manifest["files"][name]
            path = f"{ckpt.path}/{name}"
            try:
                size, crc = checksum(self.fs, path)
            except FileNotFoundError:
                return f"{name} is missing"
            if size != want["bytes"]:
                return f"{name} has {size} bytes, the manifest says {want['bytes']}"
            if crc != want["crc32"]:
                return f"{name} has checksum {crc}, the manifest says {want['crc32']}"
        return None

    # -- writing ---------------------------------------------------------------------

    def make_folder(self, path: str) -> None:
        """`path` as a folder, where the store has folders: an object store has none, and
        s3fs making one would create a missing bucket, which is the operator's to make."""
        if self.atomic_rename:  # a local (or mounted) folder
            self.fs.makedirs(path, exist_ok=True)

    def clear_staging(self) -> None:
        """Remove what saves that never committed left behind (call before saving)."""
        if not self.fs.exists(self.root):
            self.make_folder(self.root)
            return
        for entry in self.fs.ls(self.root, detail=False):
            if entry.rstrip("/").rsplit("/", 1)[-1].startswith(".staging-"):
                self.fs.rm(entry, recursive=True)

    def checksums(self, staging: str, names: list[str]) -> dict[str, dict[str, Any]]:
        """Size and checksum of each of `names` in `staging` (the files one rank wrote)."""
        out = {}
        for name in names:
            size, crc = checksum(self.fs, f"{staging}/{name}")
            out[name] = {"bytes": size, "crc32": crc}
        return out

    def files_in(self, staging: str) -> list[str]:
        return sorted(e.rstrip("/").rsplit("/", 1)[-1] for e in self.fs.ls(staging, detail=False))

    def commit(
        self, step: int, files: dict[str, dict[str, Any]], info: dict[str, Any]
    ) -> CommittedCheckpoint:
        """Write the manifest and make the staged checkpoint of `step` visible."""
        manifest = {
            "format": FORMAT,
            "step": step,
            "files": files,
            "committed_at": time.time(),
            **info,
        }
        staging, final = self.staging_path(step), self.final_path(step)
        if self.fs.exists(final):  # a step saved again (e.g. re-run after a restore)
            self.fs.rm(final, recursive=True)
        if self.atomic_rename:
            self.write_manifest(staging, manifest)
            self.fs.mv(staging, final, recursive=True)
        else:
            for name in files:
                self.fs.mv(f"{staging}/{name}", f"{final}/{name}")
            self.write_manifest(final, manifest)
            if self.fs.exists(staging):  # an object store has no empty folders to remove
                self.fs.rm(staging, recursive=True)
        log.info("committed checkpoint step %d (%d files)", step, len(files))
        return CommittedCheckpoint(step, final, manifest)

    def write_manifest(self, folder: str, manifest: dict[str, Any]) -> None:
        """Commit `folder` (written whole already) as the checkpoint `manifest` describes."""
        with self.fs.open(f"{folder}/{MANIFEST}", "w") as f:
            json.dump(manifest, f, indent=1, sort_keys=True)

    # -- pins ------------------------------------------------------------------------

    def pin(self, step: int, for_s: float) -> str:
        """Keep `step` from retention for at most `for_s` seconds; returns the pin to
        unpin() when done."""
        until = int(time.time() + for_s)
        path = self._join(PINS, f"step-{step:08d}.until-{until}.{uuid.uuid4().hex}")
        self.make_folder(self._join(PINS))
        self.fs.pipe_file(path, b"")
        return path

    def unpin(self, pin: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(pin)

    def pinned(self) -> set[int]:
        """Steps with a pin that has not lapsed."""
        folder = self._join(PINS)
        if not self.fs.exists(folder):
            return set()
        now = time.time()
        steps = set()
        for entry in self.fs.ls(folder, detail=False):
            match = _PIN.match(entry.rstrip("/").rsplit("/", 1)[-1])
            if match and int(match.group(2)) > now:
                steps.add(int(match.group(1)))
        return steps

    def prune(self, keep_last: int, protect: set[int] | None = None) -> list[int]:
        """Delete all but the newest `keep_last` committed checkpoints, never one in
        `protect` (the one restored from) or pinned; returns the steps deleted."""
        protect = (protect or set()) | self.pinned()
        deleted = []
        for ckpt in self.committed()[keep_last:]:
            if ckpt.step in protect:
                continue
            # The manifest goes first: a half-deleted folder is then no longer committed.
            self.fs.rm(f"{ckpt.path}/{MANIFEST}")
            self.fs.rm(ckpt.path, recursive=True)
            deleted.append(ckpt.step)
        return deleted
