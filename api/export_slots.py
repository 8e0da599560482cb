"""How many exports a server converts at once, and how many wait for a turn."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor

from shardline.api.errors import ApiError
from shardline.api.rate_limit import retry_after_header

# Exports convert one model each in a child process: a few at once use the host well.
EXPORTS_AT_ONCE = 2
EXPORTS_WAITING = 8
EXPORT_RETRY_S = 30.0


class ExportSlots:
    """At most `at_once` exports convert at a time, and at most `waiting` more wait for a
    turn; beyond that a request is told to come back (429). Finding and pinning the
    checkpoint runs on threads of its own, not the request pool that also serves
    authentication and /healthz."""

    def __init__(self, at_once: int = EXPORTS_AT_ONCE, waiting: int = EXPORTS_WAITING) -> None:
        self.at_once, self.waiting = at_once, waiting
        self._turns = asyncio.Semaphore(at_once)
        self._in = 0
        self.executor = ThreadPoolExecutor(at_once, thread_name_prefix="export")

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        if self._in >= self.at_once + self.waiting:
            raise ApiError(
                429,
                "too_many_exports",
                f"{self._in} exports are running or waiting on this server (at most "
                f"{self.at_once} at once); retry after the Retry-After seconds",
                headers=retry_after_header(EXPORT_RETRY_S),
            )
        self._in += 1
        try:
            async with self._turns:
                yield
        finally:
            self._in -= 1
