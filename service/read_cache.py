"""Answers of the polled reads (a token's user, a job's status, a page of the listing),
kept for a moment so that clients polling the same thing do not each cost a database
read.

What is kept is never older than the last write this process committed through a
session (`Database.session()`, where every write of the process goes: a submit, a cancel,
a token revoked, the control plane's progress): each such commit moves `commits()` on once
it has landed, and an answer read before that is not given again. (A commit outside a
session moves it only before it lands: such a write would be seen within `ttl_s`.) The
generation is taken before the read, so an answer read while a write was committing is
dropped, not kept. Writes made by another process (the CLI revoking a token, a second
API server) are seen within `ttl_s` (1 s by default, `SHARDLINE_READ_CACHE_S`; 0 turns
the cache off).

Unknown and revoked tokens are never kept: a token that fails is looked up again (and
counted against its address), and a flood of made-up tokens cannot fill the cache.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session

# A bound on what is kept: past it the cache starts again empty (a cheap bound; the
# entries of a polled read come back at its next read).
MAX_ENTRIES = 10_000

_lock = threading.Lock()
_commits = 0


def commits() -> int:
    """How many commits this process has made (and begun to make) so far."""
    return _commits


def _committed(*_: Any) -> None:
    global _commits
    with _lock:  # two commits at once must move it twice
        _commits += 1


# Before a connection commits (Core's event) and after a session has (the ORM's): an answer
# read in between is taken under the first number and dropped at the second.
event.listen(Engine, "commit", _committed)
event.listen(Session, "after_commit", _committed)


class ReadCache:
    def __init__(
        self,
        ttl_s: float,
        *,
        max_entries: int = MAX_ENTRIES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.max_entries, self.clock = ttl_s, max_entries, clock
        self._entries: dict[Hashable, tuple[float, int, Any]] = {}

    @property
    def enabled(self) -> bool:
        return self.ttl_s > 0

    def get(self, key: Hashable) -> Any | None:
        """What was kept under `key`, if it is still fresh: kept less than `ttl_s` ago and
        read after this process's last commit."""
        hit = self._entries.get(key)
        if hit is None:
            return None
        until, generation, value = hit
        if generation != _commits or until <= self.clock():
            self._entries.pop(key, None)
            return None
        return value

    def put(self, key: Hashable, value: Any, generation: int) -> None:
        """Keep `value`, read after `generation` commits, unless a commit came since."""
        if not self.enabled or generation != _commits:
            return
        if len(self._entries) >= self.max_entries:
            self._entries.clear()
        self._entries[key] = (self.clock() + self.ttl_s, generation, value)
