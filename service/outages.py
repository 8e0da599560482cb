"""Saying an outage once: a database that does not answer fails every request and every
tick of the control plane's loops until it is back, and a line (or a traceback) for each
would bury the log (a 15 s outage wrote thousands of lines). One warning when the failures
begin, one a minute while they go on, and one when they end."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from sqlalchemy import exc as db_errors

# While failures go on, how often they are said again (with how many there were).
SAY_AGAIN_S = 60.0


def database_unavailable(err: BaseException) -> bool:
    """Whether `err` means the database is down, restarting, unreachable, out of
    connections or (SQLite) locked, so the same request may succeed later; other database
    errors (a missing table, a bad query) are bugs."""
    if isinstance(err, db_errors.TimeoutError):  # no pooled connection came free in time
        return True
    if not isinstance(err, db_errors.DBAPIError):
        return False
    if err.connection_invalidated:
        return True
    if not isinstance(err, db_errors.OperationalError | db_errors.InterfaceError):
        return False
    if type(err.orig).__module__.startswith("sqlite3"):
        text = str(err.orig).lower()
        return "locked" in text or "busy" in text
    return True  # PostgreSQL: refused, terminated, timed out, starting up, ...


def first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


class OutageLog:
    """Failures of one kind said once per outage: `failed()` at each, `recovered()` at the
    next success (or, where successes are not seen, a failure more than `SAY_AGAIN_S`
    after the last one begins a new outage)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger, self.what, self.clock = logger, what, clock
        self._lock = threading.Lock()
        self.since: float | None = None  # when the failures began
        self.failures = 0
        self._last_failure = 0.0
        self._last_said = 0.0

    def failed(self, detail: str, *, traceback: bool = False) -> None:
        now = self.clock()
        with self._lock:
            if self.since is None or now - self._last_failure > SAY_AGAIN_S:
                self.since, self.failures, self._last_said = now, 0, now
                self.logger.warning(
                    "%s: %s (said again once a minute while it goes on)",
                    self.what,
                    detail,
                    exc_info=traceback,
                )
            elif now - self._last_said >= SAY_AGAIN_S:
                self._last_said = now
                self.logger.warning(
                    "%s still: %d failures over %.0f s; the last: %s",
                    self.what,
                    self.failures + 1,
                    now - self.since,
                    detail,
                )
            self.failures += 1
            self._last_failure = now

    def recovered(self) -> None:
        if self.since is None:  # the common case: no lock taken
            return
        with self._lock:
            if self.since is None:
                return
            self.logger.warning(
                "%s no more: %d failures over %.0f s",
                self.what,
                self.failures,
                self.clock() - self.since,
            )
            self.since, self.failures = None, 0
