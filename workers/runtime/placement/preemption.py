"""Preemption notices: an autoscaler or a spot handler announces a node's end with
`ray drain-node --reason DRAIN_NODE_REASON_PREEMPTION --deadline-remaining-seconds S`, and
Ray lists the node as draining with its deadline. A job with ranks there checkpoints and
goes on without it before the deadline (the supervisor acts; this only notices), as Ray
Train's PreemptionWatcher reads the same list.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)

# A notice gives 30 to 120 s; looking once a second costs one GCS call and leaves nearly
# all of it for the checkpoint and the move.
CHECK_EVERY_S = 1.0

DrainingSource = Callable[[], dict[str, int]]  # node id -> deadline in ms since the epoch


def ray_draining_nodes() -> dict[str, int]:
    """Ray's draining nodes and their deadlines (0: none); {} where Ray is not there."""
    import ray

    if not ray.is_initialized():
        return {}
    # The list Ray Train v2 reads too (ray.train.v2 ... preemption.py); not public API.
    return dict(ray._private.state.state.get_draining_nodes())


@dataclass(frozen=True)
class Notice:
    seconds_left: dict[str, float]  # each draining node of the job: seconds to its deadline

    @property
    def nodes(self) -> set[str]:
        return set(self.seconds_left)

    @property
    def first_deadline_s(self) -> float:
        """Seconds until the first node goes (inf: no deadline was given)."""
        return min(self.seconds_left.values())

    def describe(self) -> str:
        def one(node: str, left: float) -> str:
            return f"node {node} ({'no deadline' if math.isinf(left) else f'{left:.0f}s left'})"

        return ", ".join(one(n, s) for n, s in sorted(self.seconds_left.items()))


class PreemptionWatch:
    """Says once about each node of the job that starts draining."""

    def __init__(
        self,
        draining: DrainingSource = ray_draining_nodes,
        check_every_s: float = CHECK_EVERY_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.draining = draining
        self.check_every_s = check_every_s
        self.clock = clock
        self.noticed: set[str] = set()
        self._checked = -math.inf

    def check(self, job_nodes: list[str]) -> Notice | None:
        """A notice for the job's nodes that began draining since the last one (at most
        one look every `check_every_s`), or None."""
        if time.monotonic() - self._checked < self.check_every_s:
            return None
        self._checked = time.monotonic()
        try:
            drained = self.draining()
        except Exception:  # a GCS hiccup: look again next time, never fail the job for it
            log.warning("could not read Ray's draining nodes", exc_info=True)
            return None
        new = {n: d for n, d in drained.items() if n in job_nodes and n not in self.noticed}
        if not new:
            return None
        self.noticed |= set(new)
        now_ms = self.clock() * 1000
        return Notice({n: max((d - now_ms) / 1000, 0.0) if d else math.inf for n, d in new.items()})
