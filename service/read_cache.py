"""Answers of the polled reads (a token's user, a job's status, a page of the listing),
kept for a moment so that clients polling the same thing do not each cost a database
read.

What is kept is never older than the last write this process committed through a
session (`Database.session()`, where every write of the process goes: a submit, a cancel,
a token revoked, the control plane's progress): each such commit moves `commits()` on once
it has landed, and an answer read before that is not given again. (A commit outside a
session moves it only before it lands: such a write would be seen within `ttl_s`.) The
generation is taken before the read, so an answer read while a write was committing is
dropped, not kept.

Writes made by another process (the CLI revoking a token, a second API server, a script):
- on PostgreSQL, the database notifies every API server as each commits
  (service/write_notices.py moves `commits()` on), so they show at once, and while its
  own notices keep coming back to the listener an answer is kept up to `notified_ttl_s`
  (10 s by default, `SHARDLINE_READ_CACHE_NOTIFIED_S`);
- on SQLite, and on PostgreSQL while nothing is heard (the listener cut off, stalled,
  or the database without migration 0008's triggers), within `ttl_s` (1 s by default,
  `SHARDLINE_READ_CACHE_S`; 0 turns the cache off).

A kept answer is given as it was read: what it derives from the clock (a status's
goodput) is up to the time it is kept old too.

Unknown and revoked tokens are never kept: a token that fails is looked up again (and
counted against its address), and a flood of made-up tokens cannot fill the cache.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

# Bounds on what is kept. Past either, the oldest entries go first. A listing page is up to
# a few MB, and distinct cursors each make an entry, so entries alone are no bound on memory.
MAX_ENTRIES = 10_000
MAX_BYTES = 64 * 2**20
# What an entry that holds no encoded body (a token's user) is counted as.
SMALL_ENTRY_BYTES = 512

_lock = threading.Lock()
_commits = 0


def commits() -> int:
    """How many commits this process has made (and begun to make) so far."""
    return _commits


def _committed(*_: Any) -> None:
    global _commits
    with _lock:  # two commits at once must move it twice
        _commits += 1


def moved_on() -> None:
    """What was kept is older than a write: another process's, or any write made while
    nobody was told of them (service/write_notices.py)."""
    _committed()


# Before a connection commits (Core's event) and after a session has (the ORM's): an answer
# read in between is taken under the first number and dropped at the second.
event.listen(Engine, "commit", _committed)
event.listen(Session, "after_commit", _committed)


def size_of(value: Any) -> int:
    """About what `value` holds in memory: the encoded bodies in it (itself, or the parts
    of a tuple), and a small constant for the rest."""
    parts = value if isinstance(value, tuple) else (value,)
    return SMALL_ENTRY_BYTES + sum(
        len(part) for part in parts if isinstance(part, bytes | bytearray)
    )


class ReadCache:
    """Entries in the order they were kept. Every entry lives the same time (`ttl_s`, or
    `notified_ttl_s` while writes are heard of: a put that keeps for less than the entries
    held were kept for drops them all), so that is also the order they expire in: each put
    drops the expired ones from the oldest end, and the oldest first again while over
    `max_entries` or `max_bytes`. A commit makes every entry stale at once; the first put
    after it starts the cache again empty.

    While writes are heard of (`heard(sent_at)`: a write listener's own notice came back,
    so every write committed before `sent_at` has been heard of too) an entry is given
    up to `notified_ttl_s` after it was kept; past `ttl_s` only while the last such notice
    was sent less than `ttl_s` ago, so an answer is never more than `ttl_s` behind a
    write nobody was told of, whatever became of the listener."""

    def __init__(
        self,
        ttl_s: float,
        *,
        notified_ttl_s: float | None = None,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.clock = ttl_s, clock
        # How long while writes are heard of: never shorter than ttl_s.
        self.notified_ttl_s = max(ttl_s, notified_ttl_s or 0.0)
        self.max_entries, self.max_bytes = max_entries, max_bytes
        # key: (until, kept at, size, value); every entry was read after `_generation`
        # commits, and kept for `_keep_s`.
        self._entries: dict[Hashable, tuple[float, float, int, Any]] = {}
        self._generation = -1
        self._keep_s = 0.0
        self._bytes = 0
        # Until when (by `clock`) every write committed is known to have been heard of
        # within ttl_s: the latest heard `sent_at` + ttl_s.
        self._heard_until = -math.inf
        # Requests on the event loop and in the thread pool share it.
        self._lock = threading.Lock()

    def heard(self, sent_at: float) -> None:
        """Every write committed before `sent_at` (by `clock`) has moved the count on."""
        self._heard_until = max(self._heard_until, sent_at + self.ttl_s)

    @property
    def listening(self) -> bool:
        """Whether writes are heard of now (answers are kept `notified_ttl_s`)."""
        return self.clock() < self._heard_until

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    @property
    def held_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable) -> Any | None:
        """What was kept under `key`, if it is still fresh: kept less than `ttl_s` ago and
        read after this process's last commit."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        until, kept_at, _size, value = hit
        now = self.clock()
        if self._generation != _commits or until <= now:
            return None  # dropped at the next put
        if now - kept_at >= self.ttl_s and now >= self._heard_until:
            return None  # kept longer only while writes are heard of
        return value

    def put(self, key: Hashable, value: Any, generation: int) -> None:
        """Keep `value`, read after `generation` commits, unless a commit came since."""
        size = size_of(value)
        if not self.enabled or size > self.max_bytes:
            return
        with self._lock:
            # Under the lock: a put that waited for it while a commit landed must not clear
            # what was kept after that commit (the count only grows).
            if generation != _commits:
                return
            now = self.clock()  # under the lock, so entries go in the order they expire
            keep_s = self.notified_ttl_s if now < self._heard_until else self.ttl_s
            # Everything kept is older than a commit, or would outlive this entry.
            if generation != self._generation or keep_s < self._keep_s:
                self._entries.clear()
                self._bytes, self._generation = 0, generation
            self._keep_s = keep_s
            self._drop(key)  # kept again: it moves to the newest end
            while self._entries and (
                len(self._entries) >= self.max_entries
                or self._bytes + size > self.max_bytes
                or self._oldest_until() <= now
            ):
                self._drop(next(iter(self._entries)))
            self._entries[key] = (now + keep_s, now, size, value)
            self._bytes += size

    def _oldest_until(self) -> float:
        return next(iter(self._entries.values()))[0]

    def _drop(self, key: Hashable) -> None:
        gone = self._entries.pop(key, None)
        if gone is not None:
            self._bytes -= gone[2]
