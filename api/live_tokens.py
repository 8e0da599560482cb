"""The hashes of the live (issued, not revoked) API tokens, held in memory for the
failed-authentication guard (api/auth_guard.py).

An address over its failed-authentication limit is refused before any lookup, so a flood
of bad tokens costs the database nothing. Every client of a default bind (and every client
behind one proxy) shares an address, though: a request from it with a live token must not
pay for someone else's bad ones. The guard lets such a request on (the usual lookup then
authenticates it) and refuses the others. The set is read again on a miss at most once a
second, so a token issued a moment ago gets through and a flood of made-up tokens costs at
most one read a second. A token revoked since the last read still fails its lookup.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

# A miss reads the set again at most this often.
RELOAD_EVERY_S = 1.0


class LiveTokens:
    def __init__(
        self, read: Callable[[], frozenset[str]], *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.read, self.clock = read, clock
        self.hashes: frozenset[str] = frozenset()
        self.loaded_at: float | None = None
        self.reads = 0
        self._reading = threading.Lock()

    async def holds(self, token_hash: str) -> bool:
        """Whether `token_hash` is a live token's, as of at most a second ago on a miss."""
        if token_hash in self.hashes:
            return True
        if self._read_lately():  # a made-up token of a flood: answered without a thread
            return False
        return await asyncio.to_thread(self._read_again_for, token_hash)

    def _read_lately(self) -> bool:
        return self.loaded_at is not None and self.clock() - self.loaded_at < RELOAD_EVERY_S

    def _read_again_for(self, token_hash: str) -> bool:
        with self._reading:  # one read at a time; those waiting use its answer
            if token_hash in self.hashes:
                return True
            if self._read_lately():
                return False
            self.hashes = self.read()
            self.loaded_at = self.clock()
            self.reads += 1
            return token_hash in self.hashes
