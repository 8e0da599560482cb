"""Bringing the database up to date with what the supervisors know.

For every active job the reconciler reads the supervisor's buffer after the job's
`reconciled_seq` and writes it down: metrics, events and summaries in one transaction,
each state change through the store's transition function. The sequence number is
advanced in the same transaction as what it covers, so a control plane that stops at any
point and starts again neither repeats nor skips an entry. It also carries cancels to the
supervisors and removes a supervisor once its job's end is recorded.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from shardline.service.loop import PeriodicLoop
from shardline.service.models import Job
from shardline.service.store import ConcurrentUpdate, IllegalTransition, JobStore
from shardline.workers.contract.lifecycle import SUPERVISED, TERMINAL, JobState
from shardline.workers.contract.progress import ProgressEntry, ProgressRead, StateEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.supervisor.decisions import FailurePolicy

log = logging.getLogger(__name__)


class Supervisors(Protocol):
    """How the reconciler reaches supervisors (Ray in production)."""

    def exists(self, job_id: str) -> bool: ...
    def launch(self, job: Job) -> None: ...
    def read(self, job_id: str, after_seq: int) -> ProgressRead | None: ...
    def cancel(self, job_id: str) -> None: ...
    def pause(self, job_id: str) -> None: ...
    def remove(self, job_id: str) -> None: ...


class Reconciler(PeriodicLoop):
    name = "reconciler"

    def __init__(
        self,
        store: JobStore,
        supervisors: Supervisors,
        # With the supervisor's own poll, how soon a step reaches the API (a first step
        # is seen about 0.3 s after it is taken, against 0.6 s at 0.5 s each).
        interval_s: float = 0.25,
        on_freed: Callable[[], None] | None = None,
    ) -> None:
        self.store = store
        self.supervisors = supervisors
        # Called when a job has let go of its workers: a queued job may fit now.
        self.on_freed = on_freed or (lambda: None)
        super().__init__(interval_s)

    def tick(self) -> None:
        for job in self.store.active_jobs():
            if job.state not in SUPERVISED:
                continue
            try:
                self.reconcile(job)
            except ConcurrentUpdate as err:
                log.info("job %s changed while reconciling (%s); next tick", job.id, err)

    def reconcile(self, job: Job) -> None:
        if not self.supervisors.exists(job.id):
            self._supervisor_gone(job)
            return
        if job.state == JobState.CANCELLING:
            self.supervisors.cancel(job.id)
        elif job.state == JobState.PAUSING:
            self.supervisors.pause(job.id)
        snapshot = self.supervisors.read(job.id, job.reconciled_seq)
        if snapshot is None:  # no answer in time: try again next tick
            return
        self._apply(job, snapshot["entries"])
        job = self.store.get(job.id)
        # The supervisor let go of everything (it ended, or paused) in a way the job's
        # state did not take: it finished or paused just as a cancel arrived. The cancel wins.
        let_go = JobState(snapshot["state"]) in TERMINAL | {JobState.PAUSED}
        if (
            let_go
            and job.reconciled_seq >= snapshot["last_seq"]
            and job.state == JobState.CANCELLING
        ):
            self.store.transition(
                job.id, JobState.CANCELLED, f"supervisor ended {snapshot['state']} while cancelling"
            )
            job = self.store.get(job.id)
        if JobState(job.state).terminal or job.state == JobState.PAUSED:
            # A paused job gets a new supervisor when it is resumed.
            self.supervisors.remove(job.id)
            self.on_freed()

    def _apply(self, job: Job, entries: list[ProgressEntry]) -> None:
        seq = job.reconciled_seq
        batch: list[ProgressEntry] = []
        for entry in entries:
            if not isinstance(entry, StateEntry):
                batch.append(entry)
                continue
            seq = self.store.record_progress(job.id, batch, after_seq=seq)
            batch = []
            seq = self._apply_state(job.id, entry, seq)
        self.store.record_progress(job.id, batch, after_seq=seq)

    def _apply_state(self, job_id: str, entry: StateEntry, seq: int) -> int:
        target = JobState(entry.state)
        job = self.store.get(job_id)
        if job.state == target:
            # The API got there first (PAUSING, CANCELLING): only the entry is recorded.
            return self.store.record_progress(job_id, [entry], after_seq=seq)
        fields: dict[str, Any] = {"reconciled_seq": entry.seq}
        if target == JobState.RESTARTING:
            fields["restarts"] = job.restarts + 1
        if target == JobState.FAILED:
            fields["failure_reason"] = entry.reason
        try:
            self.store.transition(
                job_id, target, entry.reason, expected_version=job.version, **fields
            )
        except IllegalTransition as err:
            # The user's request won (a RUNNING reported after a cancel was asked for):
            # the entry is recorded as read, and said here.
            log.warning(
                "job %s: supervisor's %s -> %s refused (%s): %s",
                job_id,
                job.state,
                target.value,
                entry.reason,
                err,
            )
            self.store.record_progress(job_id, [entry], after_seq=seq)
        return entry.seq

    def _supervisor_gone(self, job: Job) -> None:
        if job.state == JobState.PAUSING:
            # Its workers went with it; resuming restores the newest committed checkpoint.
            self.store.transition(
                job.id,
                JobState.PAUSED,
                "the supervisor was gone while pausing; resume continues from the newest "
                "committed checkpoint",
                expected_version=job.version,
            )
            return
        if job.state == JobState.CANCELLING:
            self.store.transition(
                job.id,
                JobState.CANCELLED,
                "no supervisor was running",
                expected_version=job.version,
            )
            return
        self._relaunch(job)

    def _relaunch(self, job: Job) -> None:
        """A lost supervisor took its workers and placement group with it: a real failure,
        in the job's one budget. Start a new one, which restores the job's newest committed
        checkpoint, while the same policy the supervisors apply allows."""
        max_failures = JobSpec.model_validate(job.spec).fault_tolerance.max_failures
        failures = job.failures + 1
        decision = FailurePolicy(max_failures).decide(failures, "the job's supervisor is gone")
        if not decision.retry:
            self.store.transition(
                job.id,
                JobState.FAILED,
                decision.reason,
                expected_version=job.version,
                failure_reason=decision.reason,
                failures=failures,
            )
            return
        job = self.store.restart_supervisor(
            job.id,
            f"the job's supervisor is gone (failure {failures} of at most {max_failures}); "
            "starting a new one from the newest checkpoint",
            expected_version=job.version,
            failures=failures,
        )
        self.supervisors.launch(job)
