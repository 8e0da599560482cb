"""What the supervisor does about a preemption notice for nodes of its job: say so, give
the ranks until the deadline to checkpoint (the supervisor stops them), leave the nodes
out and restart from that checkpoint, with a recovery that says what the move cost. No
failure is counted: nothing failed."""

from __future__ import annotations

import math
import time

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.status import WorkerStatus
from shardline.workers.runtime.placement.node_health import PlacedWorkers
from shardline.workers.runtime.placement.preemption import Notice, PreemptionWatch
from shardline.workers.runtime.placement.reservation import ELASTIC_WAIT_S
from shardline.workers.runtime.supervisor.decisions import Next
from shardline.workers.runtime.supervisor.recovery import Recoveries
from shardline.workers.runtime.supervisor.relay import ProgressRelay
from shardline.workers.runtime.supervisor.workers import Workers

# The least a stop with a checkpoint is given, even past a deadline: a save cut short
# leaves only the one before it.
MIN_GRACE_S = 5.0
MAX_GRACE_S = 600.0


class Preemptions:
    def __init__(
        self,
        workers: Workers,
        relay: ProgressRelay,
        recoveries: Recoveries,
        watch: PreemptionWatch | None = None,
    ) -> None:
        self.workers = workers
        self.relay = relay
        self.recoveries = recoveries
        self.watch = watch or PreemptionWatch()
        self._replan_at_once = False  # the nodes left are all there will be: no wait
        self._noticed_at = 0.0

    def notice(self) -> Notice | None:
        """A new notice for the job's nodes (looked for at most once a second)."""
        if not isinstance(self.workers, PlacedWorkers):  # where ranks run is unknown
            return None
        return self.watch.check(self.recoveries.nodes)

    def announce(self, notice: Notice) -> float:
        """Say it; returns how long the ranks may take to checkpoint and stop."""
        self._noticed_at = time.monotonic()
        deadlines = {
            n: (None if math.isinf(s) else round(s, 1)) for n, s in notice.seconds_left.items()
        }
        self.relay.event(
            Event(
                EventKind.PREEMPTION,
                f"preemption notice: {notice.describe()}; checkpointing, then going on without it",
                {"nodes": sorted(notice.nodes), "deadline_s": deadlines},
            )
        )
        return min(MAX_GRACE_S, max(notice.first_deadline_s, MIN_GRACE_S))

    def restart_without(self, notice: Notice, statuses: list[WorkerStatus]) -> Next:
        """Once the ranks stopped (with their checkpoint) and were taken down."""
        assert isinstance(self.workers, PlacedWorkers)
        left_out = self.workers.exclude_nodes(notice.nodes)
        ranks = [r for r, node in enumerate(self.recoveries.nodes) if node in notice.nodes]
        # Timed from the notice: the checkpoint it waited for is part of what it cost.
        self.recoveries.open(
            f"a preemption notice for {notice.describe()}",
            ranks,
            self.relay.front_step,
            stalled_s=time.monotonic() - self._noticed_at,
        )
        self._replan_at_once = bool(left_out)
        step = max((s.step for s in statuses), default=0)
        where = "without it" if left_out else "on the nodes there are (none other is alive)"
        return Next(
            JobState.RESTARTING, f"preempted: restarting from the checkpoint of step {step} {where}"
        )

    def elastic_wait_s(self) -> float:
        """How long the next placement waits for the layout it has before an elastic job
        re-plans: not at all right after a preemption (the node will not come back)."""
        at_once, self._replan_at_once = self._replan_at_once, False
        return 0.0 if at_once else ELASTIC_WAIT_S
