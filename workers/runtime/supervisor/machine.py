"""The supervisor of one job: a state machine that runs, watches and restarts its workers.

A plain class (workers/runtime/actors.py makes it a named Ray actor) whose loop runs in a
thread, so its other methods answer at once. Each step returns the next state with its
reason (`Next`); each state it enters is a legal edge, put in the relay's numbered buffer
that the reconciler reads ("everything after n"). It ends when the job ends or is PAUSED.
"""

from __future__ import annotations

import logging
import threading
import time

from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.faults import FaultKind
from shardline.workers.contract.lifecycle import TERMINAL, JobState, is_legal
from shardline.workers.contract.progress import ProgressBuffer, ProgressRead
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import FINISHED, WorkerPhase, WorkerStatus
from shardline.workers.runtime.placement.elastic import describe_layout
from shardline.workers.runtime.placement.reservation import ResizableWorkers, reserve_placement
from shardline.workers.runtime.supervisor.decisions import Next
from shardline.workers.runtime.supervisor.grow import GrowBack
from shardline.workers.runtime.supervisor.handling import FailureHandling
from shardline.workers.runtime.supervisor.preempted import Preemptions
from shardline.workers.runtime.supervisor.recovery import Recovery
from shardline.workers.runtime.supervisor.relay import ProgressRelay
from shardline.workers.runtime.supervisor.watch import GroupStatus, Verdict, judge
from shardline.workers.runtime.supervisor.workers import (
    FaultRefused,
    InPlaceWorkers,
    NodeLost,
    StartCancelled,
    Workers,
    WorkersFactory,
    checkpoint_locations,
)
from shardline.workers.storage.layout import JobLayout

log = logging.getLogger(__name__)

# Between looks at the workers: how soon a step, an exit or a failure is seen. A poll is a
# lock-guarded read on each worker's actor thread, nothing on its training thread.
POLL_INTERVAL_S = 0.25
# In a recovery's first seconds (a poll per rank, read under a lock, 20 times a second).
RECOVERY_POLL_S = 0.05
RECOVERY_POLL_FOR_S = 30.0
POLL_TIMEOUT_S = 30.0
JOIN_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0
# A pause (or a grow-back) waits for the checkpoint to be written; give it time.
PAUSE_GRACE_S = 600.0
# Where the loop stops: the job ended, or let go of everything (a resume starts anew).
STOPPED = TERMINAL | {JobState.PAUSED}


class JobSupervisor:
    """The state machine of one job, and what the control plane calls on it (the Ray
    actor's methods): they answer at once from the actor's threads, and the loop acts on
    the requests."""

    def __init__(
        self,
        layout: JobLayout,
        spec: JobSpec,
        *,
        workers: Workers | None = None,
        make_workers: WorkersFactory | None = None,
        recorded_step: int = 0,
        failures: int = 0,
        recovering: bool = False,
    ) -> None:
        """`recorded_step`, `failures`: the database's; `recovering`: replaces a lost one."""
        self.layout = layout
        self.job_id = layout.job_id
        self.spec = spec  # validated once, when the job was submitted
        layout.dir.mkdir(parents=True, exist_ok=True)
        layout.spec_file.write_text(spec.model_dump_json())
        if workers is None:
            assert make_workers is not None, "give the workers or a factory for them"
            workers = make_workers(self.spec, layout, checkpoint_locations(self.spec, layout))
        self.workers = workers
        self.relay = ProgressRelay(
            self.job_id, layout.metrics_file, self.spec.train.log_every, recorded_step
        )
        self.handling = FailureHandling(self.spec, layout, workers, self.relay, failures)
        self.recoveries = self.handling.recoveries
        self.state = JobState.RESTARTING if recovering else JobState.STARTING
        if recovering:
            self.recoveries.current = Recovery(
                time.monotonic(), recorded_step, "the supervisor was lost"
            )
            self.recoveries.current.plan_in_place("the workers went with the supervisor", [])
        self.running = self.spec  # the layout running now: another after an elastic re-plan
        self.grow = GrowBack(self.spec)
        self.preemptions = Preemptions(workers, self.relay, self.recoveries)
        self._cancel = threading.Event()
        self._pause = threading.Event()
        self.finished_training = False  # its ranks are done: RUNNING a moment longer
        self._thread: threading.Thread | None = None

    # -- what the control plane calls ---------------------------------------------------

    @property
    def buffer(self) -> ProgressBuffer:
        return self.relay.buffer

    @property
    def failures(self) -> int:
        return self.handling.failures

    def start(self) -> None:
        """Run the state machine in the background (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self.run, name=f"supervise-{self.job_id}", daemon=True
            )
            self._thread.start()

    def read(self, after_seq: int) -> ProgressRead:
        """Buffered entries after `after_seq`, and the state now."""
        return {
            "entries": self.buffer.after(after_seq),
            "state": self.state.value,
            "last_seq": self.buffer.last_seq,
        }

    def cancel(self) -> None:
        self._cancel.set()
        self.handling.wake.set()

    def pause(self) -> None:
        """Checkpoint, free the workers and the placement group, end PAUSED."""
        self._pause.set()
        self.handling.wake.set()

    def inject_fault(self, kind: str, rank: int) -> None:
        """Chaos testing: have rank `rank` fail as `kind` says (workers/runtime/faults.py)."""
        fault = FaultKind(kind)
        self._running().inject_fault(rank, fault.value)
        message = f"fault injected: {self.recoveries.inject(fault.value, rank)}"
        self.relay.event(Event(EventKind.FAULT_INJECTED, message, {"fault": kind, "rank": rank}))

    def profile(self, profile_id: str, steps: int) -> int:
        """Have every rank record its next `steps` steps (workers/runtime/profiling.py)."""
        ranks = self._running().profile(profile_id, steps)
        said = f"profile {profile_id}: recording the next {steps} steps of {ranks} rank(s)"
        self.relay.event(Event(EventKind.PROFILE, said, {"profile": profile_id, "ranks": ranks}))
        return ranks

    def _running(self) -> Workers:  # to ask something of a RUNNING job's workers
        if self.state != JobState.RUNNING or self._cancel.is_set() or self._pause.is_set():
            raise FaultRefused(f"the job's supervisor is {self.state.value}, not RUNNING")
        if self.finished_training:  # still RUNNING while its end is recorded
            raise FaultRefused("the job has finished training: its workers are gone")
        return self.workers

    # -- the state machine -------------------------------------------------------------

    def run(self) -> JobState:
        while self.state not in STOPPED:
            try:
                nxt = self.step()
            except Exception as err:  # a bug or an infrastructure error: do not hang
                log.exception("job %s: supervisor step failed", self.job_id)
                nxt = self._on_error(f"supervisor error: {type(err).__name__}: {err}")
            if nxt.state != self.state:
                self._enter(nxt)
            if self.state not in STOPPED:
                time.sleep(self._interval_s())
        return self.state

    def _interval_s(self) -> float:
        """Until the next step: none before a (re)start, less in the first seconds of a
        recovery (its MTTR ends when a poll sees the first new step)."""
        if self.state in (JobState.STARTING, JobState.RESTARTING):
            return 0.0
        rec = self.recoveries.current
        quick = rec is not None and time.monotonic() - rec.failed_at < RECOVERY_POLL_FOR_S
        return RECOVERY_POLL_S if quick else POLL_INTERVAL_S

    def step(self) -> Next:
        """Take one step from the current state; returns the next state."""
        if self.state in STOPPED:  # nothing left to do: a resume starts a new supervisor
            return Next(self.state)
        if self._cancel.is_set() and self.state != JobState.CANCELLING:
            return Next(JobState.CANCELLING, "cancel requested")
        if self.state == JobState.CANCELLING:
            return self._cancel_now()
        if self.state in (JobState.STARTING, JobState.RESTARTING):
            return self._launch("started" if self.state == JobState.STARTING else "restarted")
        if self.state == JobState.PAUSING:
            return self._pause_now()
        if self._pause.is_set() and self.state == JobState.RUNNING:
            return Next(JobState.PAUSING, "pause requested: checkpointing, then freeing workers")
        return self._watch()

    def _enter(self, nxt: Next) -> None:
        edge = f"{self.state.value} -> {nxt.state.value}"
        if not is_legal(self.state, nxt.state):  # a bug: say so loudly, never hide it
            log.error("job %s: %s is no legal edge (%s)", self.job_id, edge, nxt.reason)
        log.info("job %s: %s", self.job_id, edge)
        # The entry first: a reader that sees the new state has its entry too.
        self.relay.state(nxt.state, nxt.reason)
        self.state = nxt.state

    def _on_error(self, error: str) -> Next:
        """A step raised: the job failed, unless it was letting go (cancel, pause) anyway."""
        try:
            if self.state in (JobState.CANCELLING, JobState.PAUSING):
                self.workers.release()
                done = JobState.CANCELLED if self.state == JobState.CANCELLING else JobState.PAUSED
                return Next(done, f"{done.value.lower()} after an error: {error}")
            return self.handling.failed(GroupStatus([], Verdict.FAILED, error))
        except Exception as again:  # the workers cannot even be taken down: give up
            log.exception("job %s: handling an error failed too", self.job_id)
            return Next(JobState.FAILED, f"{error}; then, taking the workers down: {again}")

    def _launch(self, verb: str) -> Next:
        self.relay.replay()
        recovery = self.recoveries.current
        if recovery is not None and recovery.in_place:
            try:
                assert isinstance(self.workers, InPlaceWorkers)
                self.workers.restart_in_place(
                    recovery.replaced, JOIN_TIMEOUT_S, cancelled=self._cancel.is_set
                )
                return self._started("restarted in place", self.running.parallel.world_size)
            except StartCancelled:
                self.workers.release()
                return Next(JobState.CANCELLING, "cancel requested while the workers started")
            except NodeLost as lost:  # the ranks are down and the placement dropped
                self.relay.event(Event(EventKind.NODE, str(lost), {"nodes": lost.nodes}))
                recovery.in_place_failed(str(lost))
            except Exception as err:  # every rank restarts instead; the recovery says why
                log.warning("job %s: recovery in place failed: %s", self.job_id, err)
                recovery.in_place_failed(str(err))
                self.workers.kill_workers()
        placed = reserve_placement(
            self.workers,
            self.running,
            self.spec,
            cancelled=self._cancel.is_set,
            on_event=self.relay.event,
            elastic_wait_s=self.preemptions.elastic_wait_s(),
        )
        if placed is None:  # cancelled while waiting for capacity
            return Next(JobState.CANCELLING, "cancel requested while waiting for capacity")
        self.recoveries.nodes, self.running = placed
        self.relay.placed(placed[0])
        try:
            self.workers.start(JOIN_TIMEOUT_S, cancelled=self._cancel.is_set)
        except StartCancelled:
            self.workers.release()
            return Next(JobState.CANCELLING, "cancel requested while the workers started")
        except NodeLost as lost:  # reserve again, without the node, in the next step
            said = f"{lost}: placing the job again"
            self.relay.event(Event(EventKind.NODE, said, {"nodes": lost.nodes}))
            return Next(self.state, str(lost))
        return self._started(verb, len(placed[0]))

    def _started(self, verb: str, world_size: int) -> Next:
        workers = self.workers
        self.relay.started(verb, world_size, workers.warm_start, workers.pooled_ranks)
        return Next(JobState.RUNNING, f"{world_size} workers {verb}")

    def _watch(self) -> Next:
        # A rank that cannot answer (stopped, wedged in C++) is caught within the hang limit.
        hang_s = self.spec.fault_tolerance.hang_timeout_s
        group = judge(self._poll(min(POLL_TIMEOUT_S, hang_s)), hang_timeout_s=hang_s)
        if group.verdict == Verdict.NONFINITE:
            return self.handling.nonfinite_loss(group)
        if group.verdict in (Verdict.FAILED, Verdict.HUNG):
            return self.handling.failed(group)
        if group.verdict == Verdict.FINISHED:
            return self._finished(group.statuses)
        notice = self.preemptions.notice()
        if notice is not None:  # checkpoint before the deadline, go on without those nodes
            statuses, ended = self._stop_to_move(self.preemptions.announce(notice))
            return ended or self.preemptions.restart_without(notice, statuses)
        # Grow only once the smaller layout trained past its restore (its recovery closed):
        # the checkpoint it grows from holds new steps, and no restart follows an untried one.
        if self.recoveries.current is None and self.grow.due(self.running, self.workers):
            return self._grow_back()
        return Next(JobState.RUNNING)

    def _poll(self, timeout_s: float) -> list[WorkerStatus]:
        """Poll the ranks and relay what they produced; the first step past a restored
        checkpoint closes the open recovery (its MTTR)."""
        statuses = self.workers.poll(timeout_s)
        restored = self.relay.collect(statuses)
        closed = self.recoveries.observe(restored, statuses, self.relay.step_time_s)
        if closed is not None:
            self.relay.event(closed)
        return statuses

    def _finished(self, statuses: list[WorkerStatus]) -> Next:
        self.finished_training = True
        self.relay.summary(statuses)
        self.workers.release()
        return Next(JobState.SUCCEEDED, "training finished")

    def _grow_back(self) -> Next:
        """Checkpoint, stop, and start again at the full layout (from that checkpoint)."""
        _, ended = self._stop_to_move(PAUSE_GRACE_S)
        if ended is not None:
            return ended
        assert isinstance(self.workers, ResizableWorkers)
        self.relay.event(self.grow.event(self.running))
        self.workers.resize(self.spec)
        self.running = self.spec
        return Next(JobState.RESTARTING, f"growing back to {describe_layout(self.spec)}")

    def _stop_to_move(self, grace_s: float) -> tuple[list[WorkerStatus], Next | None]:
        """Stop the ranks with a checkpoint and take them down, to start again elsewhere
        or at another size; or the job's end, if it finished or was cancelled meanwhile."""
        statuses = self._stop_workers(save=True, grace_s=grace_s)
        if self._cancel.is_set():
            return statuses, Next(JobState.CANCELLING, "cancel requested while checkpointing")
        if statuses and all(s.phase == WorkerPhase.DONE for s in statuses):
            return statuses, self._finished(statuses)
        self.workers.kill_workers()
        return statuses, None

    def _stop_workers(self, *, save: bool, grace_s: float) -> list[WorkerStatus]:
        """Ask every rank to stop and wait until all have: up to `grace_s`, and no longer
        than a cancel (which does not wait for a checkpoint)."""
        self.workers.request_stop(save=save)
        deadline = time.monotonic() + grace_s
        statuses: list[WorkerStatus] = []
        while time.monotonic() < deadline:
            statuses = self._poll(min(POLL_TIMEOUT_S, grace_s))
            if all(s.phase in FINISHED for s in statuses) or (save and self._cancel.is_set()):
                break
            time.sleep(POLL_INTERVAL_S)
        return statuses

    def _cancel_now(self) -> Next:
        self._stop_workers(save=False, grace_s=STOP_GRACE_S)
        self.workers.release()
        return Next(JobState.CANCELLED, "cancelled on request")

    def _pause_now(self) -> Next:
        statuses = self._stop_workers(save=True, grace_s=PAUSE_GRACE_S)
        if self._cancel.is_set():  # cancelled while pausing: the cancel wins
            return Next(JobState.CANCELLING, "cancel requested while pausing")
        self.workers.release()
        if statuses and all(s.phase == WorkerPhase.DONE for s in statuses):
            self.relay.summary(statuses)
            return Next(JobState.SUCCEEDED, "training finished before the pause took effect")
        failed = "; ".join(str(s.error) for s in statuses if s.phase == WorkerPhase.FAILED)
        if failed:
            return Next(JobState.PAUSED, f"paused after a failure while pausing: {failed}")
        step = max((s.step for s in statuses), default=0)
        return Next(JobState.PAUSED, f"paused after step {step}")
