"""Warm spares: the next attempt's worker actors, started (torch imported) while this one
trains, in the same bundles but reserving nothing, so a restart takes them instead of
starting processes. Only where ranks need no GPU (a spare has none)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from shardline.workers.contract.status import WorkerPhase, WorkerStatus

log = logging.getLogger(__name__)

# A warm spare that does not answer this fast is not worth waiting for: start a fresh one.
SPARE_CHECK_S = 5.0


class PastFirstStep:
    """Whether a world is past its start: every rank has finished a step since the first
    poll that found them all training. Processes started sooner (warm spares, the warm
    pool's replacements) slow the world's own start, and the relay of its first step."""

    def __init__(self) -> None:
        self._started_at_steps: list[int] | None = None  # each rank's first step polled

    def passed(self, statuses: list[WorkerStatus]) -> bool:
        if not statuses or not all(st.phase == WorkerPhase.TRAINING for st in statuses):
            return False
        steps = [st.step for st in statuses]
        if self._started_at_steps is None or len(self._started_at_steps) != len(steps):
            self._started_at_steps = steps
            return False
        return all(now > then for now, then in zip(steps, self._started_at_steps, strict=True))


class WarmSpares:
    def __init__(self) -> None:
        self.actors: list[Any] = []
        self.made_for: tuple[Any, ...] | None = None  # what they were made for
        self._start = PastFirstStep()

    def attempt_started(self) -> None:
        """A new attempt's world started: spares wait for its first steps again."""
        self._start = PastFirstStep()

    def due(self, statuses: list[WorkerStatus]) -> bool:
        """Whether to make spares now: once every rank has finished a step of this
        attempt (none while the group has no ranks: stopped)."""
        return not self.actors and self._start.passed(statuses)

    def make(self, make_actors: Callable[[], list[Any]], key: tuple[Any, ...]) -> None:
        self.actors, self.made_for = make_actors(), key

    def take(
        self, key: tuple[Any, ...], job_id: str, ranks: list[int] | None = None
    ) -> tuple[list[Any], bool]:
        """(the spares of `ranks` (default: all), whether any were thrown away): those
        spares if they were made for `key` and all answer; else none. The others are
        killed."""
        spares, made_for = self.actors, self.made_for
        self.actors, self.made_for = [], None
        if not spares:
            return [], False
        wanted = list(range(len(spares))) if ranks is None else ranks
        taken = [spares[r] for r in wanted if r < len(spares)]
        if made_for == key and len(taken) == len(wanted):
            try:
                # Raised back to normal priority (they started below the training ranks).
                ray.get([a.foreground.remote() for a in taken], timeout=SPARE_CHECK_S)
                kill_actors([a for r, a in enumerate(spares) if r not in wanted])
                return taken, len(taken) < len(spares)
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


def kill_and_confirm(actors: list[Any], timeout_s: float, job_id: str) -> None:
    """Kill `actors` and wait (up to `timeout_s`) until Ray reports each one dead."""
    kill_actors(actors)
    deadline = time.monotonic() + timeout_s
    alive = list(actors)
    while alive and time.monotonic() < deadline:
        alive = [a for a in alive if _answers(a, deadline - time.monotonic())]
        if alive:
            time.sleep(0.1)
    if alive:
        log.warning("job %s: %d killed rank(s) not yet seen dead", job_id, len(alive))


def _answers(actor: Any, timeout_s: float) -> bool:
    """Whether `actor` still answers (or cannot be judged within `timeout_s`)."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=max(timeout_s, 0.1))
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return True
    return True
