"""Warm spares: the next attempt's worker actors, started (torch imported) while this one
trains, in the same bundles but reserving nothing, so a restart takes them instead of
starting processes. Only where ranks need no GPU (a spare has none)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import ray

from workers.contract.status import WorkerPhase, WorkerStatus

log = logging.getLogger(__name__)

# A warm spare that does not answer this fast is not worth waiting for: start a fresh one.
SPARE_CHECK_S = 5.0


class WarmSpares:
    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.made_for: tuple[Any, ...] | None = None  # what they were made for
        self._started_at_steps: list[int] | None = None  # each rank's first step polled

    def attempt_started(self) -> None:
        """A new attempt's world started: spares wait for its first steps again."""
        self._started_at_steps = None

    def due(self, statuses: list[WorkerStatus]) -> bool:
        """Whether to make spares now: once every rank has finished a step of this
        attempt (starting processes sooner would slow the world's own start)."""
        if self.actors or not statuses:  # none while the group has no ranks (stopped)
            return False
        if not all(st.phase == WorkerPhase.TRAINING for st in statuses):
            return False
        steps = [st.step for st in statuses]
        if self._started_at_steps is None or len(self._started_at_steps) != len(steps):
            self._started_at_steps = steps
            return False
        return all(now > then for now, then in zip(steps, self._started_at_steps, strict=True))

    def make(self, make_actors: Callable[[], list[Any]], key: tuple[Any, ...]) -> None:
        self.actors, self.made_for = make_actors(), key

    def take(self, key: tuple[Any, ...], job_id: str) -> tuple[list[Any], bool]:
        """(the spares, whether any were thrown away): the spares if they were made for
        `key` and all answer; else none, and those there were are killed."""
        spares, made_for = self.actors, self.made_for
        self.actors, self.made_for = [], None
        if not spares:
            return [], False
        if made_for == key:
            try:
                # Raised back to normal priority (they started below the training ranks).
                ray.get([a.foreground.remote() for a in spares], timeout=SPARE_CHECK_S)
                return spares, False
            except Exception as err:  # a spare died with its node, or is too slow
                log.info("job %s: warm spares unusable (%s)", job_id, err)
        kill_actors(spares)
        return [], True

    def drop(self) -> bool:
        """Kill the spares; whether there were any."""
        spares, self.actors, self.made_for = self.actors, [], None
        kill_actors(spares)
        return bool(spares)


def kill_actors(actors: list[Any]) -> None:
    for a in actors:
        ray.kill(a, no_restart=True)
