"""Waiting for a world of ranks to start, in slices that give way to a cancel."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import ray

from shardline.workers.runtime.supervisor.workers import NodeLost, StartCancelled

# How often a start that waits for the world to join looks for a cancel.
START_SLICE_S = 0.5


def wait_for_start(
    refs: list[Any],
    deadline: float,
    cancelled: Callable[[], bool],
    lost: Callable[[], bool] = lambda: False,
) -> list[Any]:
    """ray.get(refs) by `deadline`, in slices of at most START_SLICE_S that check for a
    cancel between them (StartCancelled): starting a world can take minutes.

    A rank whose start failed (its actor died, with its node or otherwise) fails the
    whole start at once: the others wait in the rendezvous for it until their join
    timeout, minutes from now."""
    pending = list(refs)
    while pending:
        if cancelled():
            raise StartCancelled("cancelled while the workers were starting")
        if lost():  # its actors would wait for their node until the deadline
            raise NodeLost([])  # the caller names the nodes
        left = deadline - time.monotonic()
        if left <= 0:
            raise ray.exceptions.GetTimeoutError(f"{len(pending)} worker(s) did not start in time")
        ready, pending = ray.wait(
            pending, num_returns=len(pending), timeout=min(START_SLICE_S, left)
        )
        try:
            ray.get(ready)  # raises for a rank that failed
        except ray.exceptions.RayActorError:
            if lost():  # it died with its node
                raise NodeLost([]) from None
            raise
    return ray.get(refs)
