"""How many exports a server converts at once, and how many wait for a turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from shardline.api.errors import ApiError
from shardline.api.rate_limit import retry_after_header

# Exports convert one model each in a child process: a few at once use the host well.
EXPORTS_AT_ONCE = 2
EXPORTS_WAITING = 8
# Running and waiting exports of one user, at most: one user cannot take every slot.
EXPORTS_PER_USER = 2
EXPORT_RETRY_S = 30.0


class ExportSlots:
    """At most `at_once` exports convert at a time, and at most `waiting` more wait for a
    turn, at most `per_user` of them one user's; beyond that a request is told to come back
    (429). Finding and pinning the checkpoint runs on threads of its own, not the request
    pool that also serves authentication and /healthz."""

    def __init__(
        self,
        at_once: int = EXPORTS_AT_ONCE,
        waiting: int = EXPORTS_WAITING,
        per_user: int = EXPORTS_PER_USER,
    ) -> None:
        self.at_once, self.waiting, self.per_user = at_once, waiting, per_user
        self._turns = asyncio.Semaphore(at_once)
        self._in = 0
        self._of_user: Counter[int] = Counter()
        self.executor = ThreadPoolExecutor(at_once, thread_name_prefix="export")

    @contextlib.asynccontextmanager
    async def slot(self, user_id: int) -> AsyncIterator[None]:
        if self._of_user[user_id] >= self.per_user:
            raise ApiError(
                429,
                "too_many_exports",
                f"you have {self._of_user[user_id]} exports running or waiting on this "
                f"server (at most {self.per_user} per user); retry after the Retry-After "
                "seconds",
                headers=retry_after_header(EXPORT_RETRY_S),
            )
        if self._in >= self.at_once + self.waiting:
            raise ApiError(
                429,
                "too_many_exports",
                f"{self._in} exports are running or waiting on this server (at most "
                f"{self.at_once} at once); retry after the Retry-After seconds",
                headers=retry_after_header(EXPORT_RETRY_S),
            )
        self._in += 1
        self._of_user[user_id] += 1
        try:
            async with self._turns:
                yield
        finally:
            self._in -= 1
            self._of_user[user_id] -= 1
            if not self._of_user[user_id]:
                del self._of_user[user_id]
