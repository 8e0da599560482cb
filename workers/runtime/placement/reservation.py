"""Getting a job's placement: wait for capacity (cancel still works), and, for an elastic
job that cannot get all its ranks, re-plan to fewer data-parallel ranks."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from workers.contract.events import Event, EventKind
from workers.contract.spec import JobSpec
from workers.runtime.placement.elastic import smaller_layouts, with_dp

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


class Reserver(Protocol):
    def reserve(self, timeout_s: float) -> list[str]: ...


def reserve_placement(
    workers: Reserver,
    spec: JobSpec,
    full_dp: int,
    *,
    cancelled: Callable[[], bool],
    on_event: Callable[[Event], Any],
    elastic_wait_s: float = ELASTIC_WAIT_S,
    chunk_s: float = WAIT_CHUNK_S,
) -> tuple[list[str], JobSpec] | None:
    """Each rank's node and the layout they got, or None when cancelled while waiting."""
    current = spec
    since = time.monotonic()
    told_waiting = False
    while not cancelled():
        try:
            return workers.reserve(chunk_s), current
        except TimeoutError:
            pass
        if time.monotonic() - since < elastic_wait_s:
            continue
        smaller = smaller_layouts(current, full_dp)
        if not smaller or not isinstance(workers, ResizableWorkers):
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
        shrunk = with_dp(current, smaller[0])
        on_event(
            Event(
                EventKind.ELASTIC,
                f"elastic re-plan: dp={current.parallel.dp} does not fit the cluster now; "
                f"going on at dp={shrunk.parallel.dp} (tp={shrunk.parallel.tp}, "
                f"pp={shrunk.parallel.pp}, {shrunk.accumulation_steps} micro-batches per "
                "step, same global batch)",
                {"dp_from": current.parallel.dp, "dp_to": shrunk.parallel.dp},
            )
        )
        workers.resize(shrunk)
        current, since = shrunk, time.monotonic()
    return None
