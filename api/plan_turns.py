"""How many plans a server computes at once: a plan holds a core for up to its CPU budget
(workers/contract/planner.py), so one user may run one at a time, and the server a few."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from shardline.api.errors import ApiError
from shardline.api.rate_limit import retry_after_header

PLANS_AT_ONCE = 2
PLAN_RETRY_S = 5.0


class PlanTurns:
    def __init__(self, at_once: int = PLANS_AT_ONCE) -> None:
        self.at_once = at_once
        self._lock = threading.Lock()
        self._planning: set[int] = set()  # the users whose plan runs now

    def planning(self, user_id: int) -> bool:
        """Whether `user_id`'s plan runs now."""
        with self._lock:
            return user_id in self._planning

    @contextlib.contextmanager
    def turn(self, user_id: int) -> Iterator[None]:
        with self._lock:
            if user_id in self._planning:
                why = "your previous plan is still being computed; one plan at a time per user"
            elif len(self._planning) >= self.at_once:
                why = f"{self.at_once} plans are being computed on this server (at most)"
            else:
                why = None
                self._planning.add(user_id)
        if why is not None:
            raise ApiError(
                429,
                "too_many_plans",
                f"{why}; retry after the Retry-After seconds",
                headers=retry_after_header(PLAN_RETRY_S),
            )
        try:
            yield
        finally:
            with self._lock:
                self._planning.discard(user_id)
