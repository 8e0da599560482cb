"""The tokenized-corpus cache: one memmap per (files, tokenizer), in SHARDLINE_CACHE_DIR,
kept under SHARDLINE_TOKEN_CACHE_BYTES by dropping the corpora used longest ago."""

from __future__ import annotations

import fcntl
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from shardline.workers.contract.data_access import DataAccess

log = logging.getLogger(__name__)


def stamp_files(h: Any, files: list[Path], access: DataAccess, field: str = "data.path") -> None:
    """Add each file's resolved path, size and modification time to the hash `h`: what
    names a cached corpus, so that an edit of a file makes a new one. Each file is
    checked against the data roots even when the cache would answer: a cached file is
    still a read of it."""
    for f in files:
        real = access.check(f, field)
        st = real.stat()
        h.update(f"{real}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())


@contextmanager
def building(target: Path) -> Iterator[None]:
    """Held while `target` (a cached corpus) is built, so that of the ranks on one node
    that need it one tokenizes and the others wait for it and read it, rather than all
    tokenizing the same corpus at once. An advisory lock on a file of the cache's locks
    folder (not beside it, where pruning counts files), let go when the process ends
    however it ends."""
    lock = cache_dir() / "locks" / f"{target.parent.name}-{target.name}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another process to tokenize %s", target.name)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def cache_dir() -> Path:
    return Path(os.environ.get("SHARDLINE_CACHE_DIR", Path.home() / ".cache" / "shardline"))


# The tokenized-corpus cache keeps at most this many bytes (SHARDLINE_TOKEN_CACHE_BYTES),
# dropping the corpora used longest ago: every new corpus, or every edit of one, adds a file.
TOKEN_CACHE_BYTES = 20 << 30


def token_cache_limit() -> int:
    raw = os.environ.get("SHARDLINE_TOKEN_CACHE_BYTES")
    try:
        return int(raw) if raw else TOKEN_CACHE_BYTES
    except ValueError:
        log.warning(
            "SHARDLINE_TOKEN_CACHE_BYTES=%r is not a number of bytes; using %d",
            raw,
            TOKEN_CACHE_BYTES,
        )
        return TOKEN_CACHE_BYTES


def prune_token_cache(folder: Path, keep: Path, limit: int) -> list[Path]:
    """Delete the least recently used cached corpora until the folder holds at most
    `limit` bytes, never `keep` (the one in use now); returns what was deleted. A job that
    has a deleted file mapped keeps reading it (the data lives until it is unmapped)."""
    entries = []
    for path in folder.iterdir():
        if ".tmp" in path.suffix or path == keep:
            continue  # a corpus being written, or the one just used
        try:
            st = path.stat()
        except FileNotFoundError:
            continue  # pruned by another job meanwhile
        entries.append((st.st_mtime, st.st_size, path))
    total = sum(size for _, size, _ in entries) + (keep.stat().st_size if keep.exists() else 0)
    deleted = []
    for _, size, path in sorted(entries):  # oldest use first
        if total <= limit:
            break
        path.unlink(missing_ok=True)
        total -= size
        deleted.append(path)
    if deleted:
        log.info(
            "token cache over %d bytes: removed %d corpora used longest ago", limit, len(deleted)
        )
    return deleted
