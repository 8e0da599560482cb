"""What the supervisor does about a group that failed, hung or saw a non-finite loss:
count the failure in the job's one budget (or the skip in max_nonfinite_skips), say so,
take the workers down and open the recovery that the next new step closes."""

from __future__ import annotations

import threading

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.placement.node_health import NodeHealth, PlacedWorkers
from shardline.workers.runtime.supervisor.decisions import (
    FailurePolicy,
    Next,
    NonFinitePolicy,
    why_not_in_place,
)
from shardline.workers.runtime.supervisor.recovery import Recoveries
from shardline.workers.runtime.supervisor.relay import ProgressRelay
from shardline.workers.runtime.supervisor.watch import GroupStatus
from shardline.workers.runtime.supervisor.workers import InPlaceWorkers, Workers
from shardline.workers.storage.layout import JobLayout


class FailureHandling:
    def __init__(
        self,
        spec: JobSpec,
        layout: JobLayout,
        workers: Workers,
        relay: ProgressRelay,
        failures: int,
    ) -> None:
        ft = spec.fault_tolerance
        self.policy = FailurePolicy(ft.max_failures)
        self.nonfinite = NonFinitePolicy(ft.max_nonfinite_skips)
        self.wanted_in_place = ft.recover_in_place
        self.gpus = spec.resources.gpus_per_worker > 0
        self.layout = layout
        self.workers = workers
        self.relay = relay
        self.failures = failures  # the job's real failures, all supervisors together
        self.recoveries = Recoveries()
        self.health = NodeHealth()
        self.wake = threading.Event()  # cuts a backoff short for a cancel or a pause

    def failed(self, group: GroupStatus) -> Next:
        """A real failure: it spends the failure budget; retried after a backoff (that a
        cancel or a pause cuts short), or the job fails."""
        moved = self.health.leave_out(self.workers, group.lost, self.relay.event)
        node_suspect, replace = self._node_suspect(group), group.to_replace()
        why_not = (
            f"node(s) {moved} left out of the placement"
            if moved
            else self._why_not_in_place(replace, len(group.statuses), node_suspect)
        )
        # Counted once the ranks are down: an error taking them down is handled as this
        # same failure (the step runs again), not counted as a second one. In place, the
        # restart kills the lost ranks only.
        if why_not is not None:
            self.workers.kill_workers()
        self.failures += 1
        decision = self.policy.decide(
            self.failures,
            group.error,
            deterministic=group.deterministic,
            node_suspect=node_suspect,
            # A recovery still open: the world it started has not trained a new step.
            progressed=self.recoveries.current is None,
        )
        # The event carries the job's count: the reconciler stores it with the event, so
        # it counts even where the state it leads to is not taken (a cancel won) or not
        # new (a failure while RESTARTING).
        self.relay.event(
            Event(
                EventKind.FAILURE,
                f"failure: {decision.reason}",
                {"retry": decision.retry, "failures": self.failures},
            )
        )
        recovery = self.recoveries.open(
            group.error, group.ranks, self.relay.front_step, group.stalled_s
        )
        recovery.rank_steps = group.rank_steps
        recovery.plan_in_place(why_not, replace)
        if not decision.retry:
            self.workers.release()
            return Next(JobState.FAILED, decision.reason)
        # The new workers restore the newest committed checkpoint (metrics already sent
        # are not sent twice).
        self.wake.wait(decision.backoff_s)
        return Next(JobState.RESTARTING, decision.reason)

    def _why_not_in_place(self, lost: list[int], world_size: int, node_suspect: bool) -> str | None:
        """Why every rank restarts rather than only the `lost` ones (None: in place)."""
        last = self.recoveries.current  # still open: its world trained no step
        return why_not_in_place(
            wanted=self.wanted_in_place,
            able=isinstance(self.workers, InPlaceWorkers),
            gpus=self.gpus,
            lost=lost,
            world_size=world_size,
            node_suspect=node_suspect,
            looping=last is not None and last.in_place,
        )

    def _node_suspect(self, group: GroupStatus) -> bool:
        """Whether a node of the job may be lost: a rank died or stopped answering and no
        rank on its node answered. A killed or frozen process beside a rank that answers
        is no node loss, and is restarted at once."""
        if not group.lost:
            return False
        if not isinstance(self.workers, PlacedWorkers):
            return True
        answered = [s.rank for s in group.statuses if s.rank not in group.lost]
        alive = set(self.workers.node_of(answered))
        return any(node not in alive for node in self.workers.node_of(group.lost))

    def nonfinite_loss(self, group: GroupStatus) -> Next:
        """Roll back to the newest snapshot and skip the batch, or fail (the policy says
        which). It spends max_nonfinite_skips, not the failure budget; nothing waits."""
        bad = group.nonfinite
        assert bad is not None  # the verdict says there is one
        record = self.layout.skipped_batches()
        decision = self.nonfinite.decide(bad.step, bad.loss, bad.batch, record.read())
        if decision.skip:
            record.add(bad.step, bad.batch)
        self.relay.event(
            Event(
                EventKind.NONFINITE,
                f"non-finite loss: {decision.reason}",
                {"step": bad.step, "batch": bad.batch, "skipped": decision.skip},
            )
        )
        # Every rank answered: none is lost, all may go on in their processes.
        why_not = self._why_not_in_place([], len(group.statuses), node_suspect=False)
        if why_not is not None:
            self.workers.kill_workers()
        if not decision.skip:
            self.workers.release()
            return Next(JobState.FAILED, decision.reason)
        recovery = self.recoveries.open(
            f"a non-finite loss at step {bad.step}", group.ranks, self.relay.front_step
        )
        recovery.skipped = {"step": bad.step, "batch": bad.batch}
        recovery.plan_in_place(why_not, [])
        return Next(JobState.RESTARTING, decision.reason)
