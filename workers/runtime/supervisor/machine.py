"""The supervisor of one job: a state machine that runs, watches and restarts its workers.

A plain class; `workers/runtime/actors.py` makes it a detached, named Ray actor. Its loop runs in
a thread, so `read()` and `cancel()` answer at once. Everything the control plane needs
(state changes, events, metrics) goes into a sequence-numbered buffer that the reconciler
reads with "everything after n".
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any, Protocol

from workers.contract.lifecycle import TERMINAL, JobState
from workers.contract.progress import (
    CheckpointEntry,
    EventEntry,
    MetricsEntry,
    ProgressBuffer,
    ProgressRead,
    StateEntry,
    SummaryEntry,
)
from workers.contract.spec import JobSpec
from workers.contract.status import FINISHED, WorkerPhase, WorkerStatus
from workers.runtime.faults import FaultKind
from workers.runtime.placement.node_health import NodeHealth
from workers.runtime.placement.reservation import ResizableWorkers, reserve_placement
from workers.runtime.supervisor.decisions import FailurePolicy
from workers.runtime.supervisor.nonfinite import NonFinitePolicy
from workers.runtime.supervisor.recovery import Recovery, first_failed_ranks, stalled_for
from workers.runtime.supervisor.relay import logged_metrics_after
from workers.runtime.worker import CheckpointTargets
from workers.storage.checkpoints import RestoreSource
from workers.storage.layout import JobStorage
from workers.storage.skipped_batches import SkippedBatches

log = logging.getLogger(__name__)

# Between looks at the workers: how soon a step, an exit or a failure is seen. A poll is a
# lock-guarded read on each worker's actor thread, nothing on its training thread.
POLL_INTERVAL_S = 0.25
POLL_TIMEOUT_S = 30.0
# How often a shrunk elastic job looks for the capacity to grow back.
GROW_CHECK_S = 5.0
JOIN_TIMEOUT_S = 300.0
STOP_GRACE_S = 5.0


# A pause waits for the checkpoint to be written; give it time.
PAUSE_GRACE_S = 600.0


class Workers(Protocol):
    """What the supervisor needs of its worker group (fakeable in unit tests)."""

    def reserve(self, timeout_s: float) -> list[str]: ...
    def start(self, join_timeout_s: float) -> None: ...
    def poll(self, timeout_s: float) -> list[WorkerStatus]: ...
    def request_stop(self, save: bool = False) -> None: ...
    def kill_workers(self) -> None: ...
    def release(self) -> None: ...
    def inject_fault(self, rank: int, kind: str) -> None: ...

    # Whether the last start() ran on warm spares (said in the "workers started" event).
    @property
    def warm_start(self) -> bool: ...


class FaultRefused(RuntimeError):
    """A fault cannot be injected now (the job is not running); the API answers 409."""


class JobSupervisor:
    def __init__(
        self,
        job_id: str,
        spec_json: str,
        storage_root: str,
        workers: Workers | None = None,
        recorded_step: int | None = None,
        recovering: bool = False,
    ) -> None:
        self.job_id = job_id
        self.spec = JobSpec.model_validate_json(spec_json)
        self.storage = JobStorage(storage_root, job_id)
        self.storage.dir.mkdir(parents=True, exist_ok=True)
        self.storage.spec_file.write_text(spec_json)
        if workers is None:
            from workers.runtime.worker_group import WorkerGroup

            workers = WorkerGroup(
                job_id,
                self.spec,
                self.storage,
                checkpoint_targets(self.spec, storage_root, job_id),
            )
        self.workers = workers
        self.policy = FailurePolicy(self.spec.fault_tolerance.max_failures)
        self.buffer = ProgressBuffer()
        self.state = JobState.STARTING
        self.failures = 0
        # Metrics up to here are recorded or buffered; a restart must not resend them. A
        # supervisor replacing a lost one starts from what the database holds.
        self.reported_step = recorded_step or 0
        self._front_step = 0  # the furthest step any rank reported
        self._recovery: Recovery | None = None  # from a failure to the next new step
        if recovering:  # this supervisor replaces a lost one
            self._recovery = Recovery(
                time.monotonic(), self.reported_step, cause="the supervisor was lost"
            )
        self.nonfinite = NonFinitePolicy(
            self.spec.fault_tolerance.max_nonfinite_skips,
            SkippedBatches(str(self.storage.checkpoints_dir)),
        )
        self._nodes: list[str] = []  # each rank's node, as placed
        self._step_time_s: float | None = None  # the latest logged step time
        self._injected: str | None = None  # a fault injected since the last recovery
        self._wake = threading.Event()  # cuts a backoff short for a cancel or a pause
        self.layout = self.spec  # the layout running now: fewer dp ranks after a re-plan
        self.health = NodeHealth()
        self._grow_checked = 0.0
        self._cancel = threading.Event()
        self._pause = threading.Event()
        self._thread: threading.Thread | None = None
        # Why the state is about to change, for the event of the transition.
        self._reason = ""

    # -- what the control plane calls --------------------------------------------------

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
        self._wake.set()

    def pause(self) -> None:
        """Checkpoint, free the workers and the placement group, end PAUSED."""
        self._pause.set()
        self._wake.set()

    def inject_fault(self, kind: str, rank: int) -> None:
        """Chaos testing: have rank `rank` fail the way `kind` says (workers/runtime/faults.py)."""
        fault = FaultKind(kind)
        if self.state != JobState.RUNNING or self._cancel.is_set() or self._pause.is_set():
            raise FaultRefused(f"the job's supervisor is {self.state.value}, not RUNNING")
        self.workers.inject_fault(rank, fault.value)
        self._injected = f"{fault.value} on rank {rank}"
        self._event(f"fault injected: {self._injected}", fault=fault.value, rank=rank)

    # -- the state machine -------------------------------------------------------------

    def run(self) -> JobState:
        while self.state not in TERMINAL:
            try:
                nxt = self.step()
            except Exception as err:  # a bug or an infrastructure error: do not hang
                log.exception("job %s: supervisor step failed", self.job_id)
                nxt = self._on_failure(f"supervisor error: {type(err).__name__}: {err}")
            if nxt != self.state:
                self._enter(nxt)
            if self.state not in TERMINAL:
                time.sleep(POLL_INTERVAL_S)
        return self.state

    def step(self) -> JobState:
        """Take one step from the current state; returns the next state."""
        if self._cancel.is_set() and self.state not in TERMINAL:
            return self._cancel_now()
        if self.state == JobState.STARTING:
            return self._launch("started")
        if self.state == JobState.RESTARTING:
            return self._launch("restarted")
        if self._pause.is_set() and self.state == JobState.RUNNING:
            return self._pause_now()
        return self._watch()

    def _enter(self, state: JobState, reason: str = "") -> None:
        log.info("job %s: %s -> %s", self.job_id, self.state.value, state.value)
        self.state = state
        self.buffer.append(StateEntry(state=state.value, reason=reason or self._reason))
        self._reason = ""

    def _event(self, message: str, **data: Any) -> None:
        log.info("job %s: %s", self.job_id, message)
        self.buffer.append(EventEntry(message=message, data=data))

    def _launch(self, verb: str) -> JobState:
        self._replay_logged_metrics()
        placed = reserve_placement(
            self.workers,
            self.layout,
            self.spec.parallel.dp,
            cancelled=self._cancel.is_set,
            on_event=self._event,
        )
        if placed is None:  # cancelled while waiting for capacity
            return self._cancel_now()
        nodes, self.layout = placed
        self._nodes = nodes
        self._event(
            f"placement group ready: {len(nodes)} ranks on {len(set(nodes))} node(s)",
            nodes=sorted(set(nodes)),
        )
        self.workers.start(JOIN_TIMEOUT_S)
        warm = self.workers.warm_start
        self._event(
            f"workers {verb}" + (" on warm spares" if warm else ""),
            world_size=len(nodes),
            warm_spares=warm,
        )
        self._reason = f"{len(nodes)} workers {verb}"
        return JobState.RUNNING

    def _replay_logged_metrics(self, before: int | None = None) -> None:
        """Buffer what rank 0 logged after `reported_step` (and before `before`) but nobody
        passed on: metrics a killed rank 0 held since the last poll, or a lost
        predecessor's. The workers about to start resume from the newest checkpoint, which
        may be past those steps."""
        for metrics in logged_metrics_after(self.storage.metrics_file, self.reported_step):
            if before is not None and metrics["step"] >= before:
                continue
            if metrics["step"] > self.reported_step:  # a restarted rank 0 logs steps again
                self.buffer.append(MetricsEntry(step=metrics["step"], values=metrics))
                self.reported_step = metrics["step"]

    def _collect(self, statuses: list[WorkerStatus]) -> None:
        """Buffer what the ranks produced since the last poll, each entry once."""
        for status in statuses:
            self._front_step = max(self._front_step, status.step)
            for event in status.events:
                if self._recovery and event.message.startswith("restored checkpoint"):
                    self._recovery.restored_step = event.data["step"]
                self._event(event.message, **event.data)
            for m in status.metrics:
                self._step_time_s = m.get("step_time_s", self._step_time_s)
                if m["step"] > self.reported_step + self.spec.train.log_every:
                    # A gap: a rank 0 whose polls never arrived logged those steps (a
                    # world restored past them). Its metrics file has them.
                    self._replay_logged_metrics(before=m["step"])
                if m["step"] > self.reported_step:
                    self.buffer.append(MetricsEntry(step=m["step"], values=m))
                    self.reported_step = m["step"]
            for commit in status.checkpoints:
                self.buffer.append(CheckpointEntry(commit=commit))
        self._note_recovered(statuses)

    def _note_recovered(self, statuses: list[WorkerStatus]) -> None:
        """After a failure, the first step past the restored one ends the recovery: say how
        long it took (MTTR) and how many steps are trained again."""
        rec = self._recovery
        if rec is None or not any(
            s.phase == WorkerPhase.TRAINING and s.step > rec.restored_step for s in statuses
        ):
            return
        message, data = rec.closing_event(self._step_time_s)
        self._event(message, **data)
        self._recovery = None

    def _watch(self) -> JobState:
        # A rank that cannot answer (stopped, wedged in C++) is caught within the hang limit.
        statuses = self.workers.poll(min(POLL_TIMEOUT_S, self.spec.fault_tolerance.hang_timeout_s))
        self._collect(statuses)
        failed = [s for s in statuses if s.phase == WorkerPhase.FAILED]
        if failed and all(s.nonfinite for s in failed):
            return self._on_nonfinite(failed)
        if failed:
            self.health.leave_out(self.workers, [s.rank for s in failed if s.lost], self._event)
            return self._on_failure(
                "; ".join(f"rank {s.rank}: {s.error}" for s in failed),
                deterministic=any(s.deterministic for s in failed),
                ranks=first_failed_ranks(failed),
            )
        hung = self._hung_ranks(statuses)
        if hung:
            self.health.leave_out(self.workers, hung, self._event)
            limit = self.spec.fault_tolerance.hang_timeout_s
            at = {s.rank: s.step for s in statuses}
            behind = ", ".join(f"rank {r} at step {at[r]}" for r in hung)
            return self._on_failure(
                f"no progress for {limit:.0f}s on rank(s) {hung} ({behind}; the front at "
                f"step {max(at.values())})",
                ranks=hung,
                rank_steps=at,
                stalled_s=stalled_for(statuses, hung),
            )
        if all(s.phase == WorkerPhase.DONE for s in statuses):
            self._append_summary(statuses)
            self.workers.release()
            self._reason = "training finished"
            return JobState.SUCCEEDED
        if self._capacity_is_back():
            return self._grow_back()
        return JobState.RUNNING

    def _capacity_is_back(self) -> bool:
        """A shrunk elastic job, now and then: could the cluster hold its full size?"""
        if self.layout.parallel.dp >= self.spec.parallel.dp or not isinstance(
            self.workers, ResizableWorkers
        ):
            return False
        if time.monotonic() - self._grow_checked < GROW_CHECK_S:
            return False
        self._grow_checked = time.monotonic()
        return self.workers.has_room_for(self.spec)

    def _grow_back(self) -> JobState:
        """Checkpoint, stop, and start again at the full layout (from that checkpoint)."""
        statuses = self._stop_workers(save=True, grace_s=PAUSE_GRACE_S)
        if statuses and all(s.phase == WorkerPhase.DONE for s in statuses):
            self._append_summary(statuses)
            self.workers.release()
            self._reason = "training finished"
            return JobState.SUCCEEDED
        self.workers.kill_workers()
        assert isinstance(self.workers, ResizableWorkers)
        self._event(
            f"elastic: capacity is back, growing from dp={self.layout.parallel.dp} to "
            f"dp={self.spec.parallel.dp} from a checkpoint",
            dp_from=self.layout.parallel.dp,
            dp_to=self.spec.parallel.dp,
        )
        self.workers.resize(self.spec)
        self.layout = self.spec
        self._reason = f"growing back to dp={self.spec.parallel.dp}"
        return JobState.RESTARTING

    def _append_summary(self, statuses: list[WorkerStatus]) -> None:
        summary = next((s.summary for s in statuses if s.summary), None)
        self.buffer.append(SummaryEntry(summary=summary))

    def _hung_ranks(self, statuses: list[WorkerStatus]) -> list[int]:
        # Joining has its own timeout (JOIN_TIMEOUT_S), and ranks already training wait,
        # rightly, on one still building its model: only a fully started world can hang.
        if any(s.phase in (WorkerPhase.IDLE, WorkerPhase.JOINING) for s in statuses):
            return []
        limit = self.spec.fault_tolerance.hang_timeout_s
        now = time.time()
        hung = [
            s.rank
            for s in statuses
            if s.phase == WorkerPhase.TRAINING and now - s.last_progress > limit
        ]
        if hung:
            front = max(s.step for s in statuses)
            behind = [s.rank for s in statuses if s.step < front]
            return behind or hung  # name the ranks that were behind where there are some
        return []

    def _on_failure(
        self,
        error: str,
        *,
        deterministic: bool = False,
        ranks: list[int] | None = None,
        rank_steps: dict[int, int] | None = None,
        stalled_s: float = 0.0,
    ) -> JobState:
        self.failures += 1
        decision = self.policy.decide(self.failures, error, deterministic=deterministic)
        self._event(f"failure: {decision.reason}", retry=decision.retry)
        self.workers.kill_workers()
        self._reason = decision.reason
        self._recovery = self._open_recovery(error, ranks or [], stalled_s)
        self._recovery.rank_steps = rank_steps
        if not decision.retry:
            self.workers.release()
            return JobState.FAILED
        # The new workers restore the newest committed checkpoint (metrics already sent
        # are not sent twice). A cancel or pause cuts the wait short.
        self._wake.wait(decision.backoff_s)
        return JobState.RESTARTING

    def _open_recovery(self, cause: str, ranks: list[int], stalled_s: float = 0.0) -> Recovery:
        nodes = sorted({self._nodes[r] for r in ranks if r < len(self._nodes)})
        recovery = Recovery(time.monotonic() - stalled_s, self._front_step, cause, ranks, nodes)
        recovery.injected, self._injected = self._injected, None
        return recovery

    def _on_nonfinite(self, failed: list[WorkerStatus]) -> JobState:
        """Roll back to the newest snapshot and skip the batch, or fail (the policy says
        which). Not a failure of the infrastructure: it counts against
        max_nonfinite_skips, not max_failures, and nothing waits."""
        bad = failed[0].nonfinite
        assert bad is not None  # _watch sends only ranks that saw one
        decision = self.nonfinite.decide(bad.step, bad.batch, bad.loss)
        self._event(
            f"non-finite loss: {decision.reason}",
            step=bad.step,
            batch=bad.batch,
            skipped=decision.skip,
        )
        self.workers.kill_workers()
        self._reason = decision.reason
        if not decision.skip:
            self.workers.release()
            return JobState.FAILED
        self._recovery = self._open_recovery(
            f"a non-finite loss at step {bad.step}", [s.rank for s in failed]
        )
        self._recovery.skipped = {"step": bad.step, "batch": bad.batch}
        return JobState.RESTARTING

    def _stop_workers(self, *, save: bool, grace_s: float) -> list[WorkerStatus]:
        """Ask every rank to stop and wait (up to `grace_s`) until all have."""
        self.workers.request_stop(save=save)
        deadline = time.monotonic() + grace_s
        statuses: list[WorkerStatus] = []
        while time.monotonic() < deadline:
            statuses = self.workers.poll(min(POLL_TIMEOUT_S, grace_s))
            self._collect(statuses)
            if all(s.phase in FINISHED for s in statuses):
                break
            time.sleep(POLL_INTERVAL_S)
        return statuses

    def _cancel_now(self) -> JobState:
        self._stop_workers(save=False, grace_s=STOP_GRACE_S)
        self.workers.release()
        self._reason = "cancelled on request"
        return JobState.CANCELLED

    def _pause_now(self) -> JobState:
        statuses = self._stop_workers(save=True, grace_s=PAUSE_GRACE_S)
        self.workers.release()
        if statuses and all(s.phase == WorkerPhase.DONE for s in statuses):
            self._append_summary(statuses)
            self._reason = "training finished before the pause took effect"
            return JobState.SUCCEEDED
        failed = [str(s.error) for s in statuses if s.phase == WorkerPhase.FAILED]
        step = max((s.step for s in statuses), default=0)
        self._reason = (
            f"paused after step {step}"
            if not failed
            else f"paused after a failure while pausing: {'; '.join(failed)}"
        )
        return JobState.PAUSED


def checkpoint_targets(spec: JobSpec, storage_root: str, job_id: str) -> CheckpointTargets:
    """The job saves into its own folder and starts from it; a job with `resume_from`
    starts from that job's checkpoint until it has one of its own."""
    own = str(JobStorage(storage_root, job_id).checkpoints_dir)
    restore = [RestoreSource(own)]
    if spec.resume_from is not None:
        source = JobStorage(storage_root, spec.resume_from.job_id).checkpoints_dir
        restore.append(RestoreSource(str(source), step=spec.resume_from.step))
    return CheckpointTargets(save_dir=own, restore_from=restore)
