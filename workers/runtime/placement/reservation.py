"""Getting a job's placement: wait for capacity (cancel still works), and, for an elastic
job that cannot get all its ranks, re-plan the whole layout on fewer ranks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.placement.elastic import describe_layout, next_smaller

log = logging.getLogger(__name__)

# How long one wait for the placement group lasts before cancel is looked at again.
WAIT_CHUNK_S = 1.0
# How long an elastic job waits for its current size before shrinking one step: long
# enough for a rank's replacement on a live node, short next to a lost node's absence.
ELASTIC_WAIT_S = 10.0


@runtime_checkable
class ResizableWorkers(Protocol):
    def reserve(self, timeout_s: float) -> list[str]: ...
    def resize(self, spec: JobSpec) -> None: ...
    def has_room_for(self, spec: JobSpec) -> bool: ...
    # Whether a node of the last placement is dead: it will not come back (Ray never
    # reuses a node's ID), so waiting for the old size is waiting for other capacity.
    def lost_a_node(self) -> bool: ...


class Reserver(Protocol):
    def reserve(self, timeout_s: float) -> list[str]: ...


def reserve_placement(
    workers: Reserver,
    spec: JobSpec,
    full: JobSpec,
    *,
    cancelled: Callable[[], bool],
    on_event: Callable[[Event], Any],
    elastic_wait_s: float = ELASTIC_WAIT_S,
    chunk_s: float = WAIT_CHUNK_S,
) -> tuple[list[str], JobSpec] | None:
    """Each rank's node and the layout they got, or None when cancelled while waiting.
    `spec` is the layout to try first, `full` the one the user asked for (an elastic job's
    smaller layouts are planned again from it)."""
    current = spec
    since = time.monotonic()
    told_waiting = False
    while not cancelled():
        try:
            return workers.reserve(chunk_s), current
        except TimeoutError:
            pass
        # The first re-plan comes at once where a node the job ran on is dead.
        gone = current is spec and isinstance(workers, ResizableWorkers) and workers.lost_a_node()
        if time.monotonic() - since < elastic_wait_s and not gone:
            continue
        shrunk = next_smaller(current, full) if isinstance(workers, ResizableWorkers) else None
        if shrunk is None or not isinstance(workers, ResizableWorkers):
            if not told_waiting:
                on_event(
                    Event(
                        EventKind.WAITING,
                        f"waiting for capacity: {current.parallel.world_size} ranks do not fit "
                        "the cluster now",
                        {"world_size": current.parallel.world_size},
                    )
                )
                told_waiting = True
            continue
        on_event(replanned(current, shrunk))
        workers.resize(shrunk)
        current, since = shrunk, time.monotonic()
    return None


def replanned(running: JobSpec, shrunk: JobSpec) -> Event:
    before, after = running.parallel, shrunk.parallel
    return Event(
        EventKind.ELASTIC,
        f"elastic re-plan: {describe_layout(running)} does not fit the cluster now; going "
        f"on at {describe_layout(shrunk)}, micro-batch {shrunk.train.micro_batch_size}, "
        f"{shrunk.accumulation_steps} micro-batches per step, same global batch: the "
        "planner's fastest layout on those ranks",
        {
            "dp_from": before.dp,
            "dp_to": after.dp,
            "from": before.model_dump(mode="json"),
            "to": after.model_dump(mode="json"),
            "train": {
                "micro_batch_size": shrunk.train.micro_batch_size,
                "activation_checkpointing": shrunk.train.activation_checkpointing.value,
            },
        },
    )
