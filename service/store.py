"""The job store: creating jobs idempotently and moving them between states safely.

Every change of state goes through `JobStore.transition`, which checks the edge is legal
and updates the row only if its version is still the one the caller read (compare-and-
swap). Two writers racing on one job cannot both win: the loser gets `ConcurrentUpdate`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from sqlalchemy import ColumnElement, delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, joinedload

from shardline.service.db import Database
from shardline.service.models import Checkpoint, DeletedJob, Job, JobEvent, JobMetric, utcnow
from shardline.service.principal import Viewer
from shardline.workers.contract.events import Event, EventKind
from shardline.workers.contract.lifecycle import ACTIVE, JobState, is_legal
from shardline.workers.contract.progress import (
    CheckpointCommit,
    CheckpointEntry,
    EventEntry,
    MetricsEntry,
    ProgressEntry,
    SummaryEntry,
)
from shardline.workers.contract.spec import JobSpec, spec_hash

log = logging.getLogger(__name__)


class StoreError(Exception):
    """Base of the store's errors; `code` is what the API reports."""

    code = "store_error"


class JobNotFound(StoreError):
    code = "not_found"


class IdempotencyConflict(StoreError):
    code = "idempotency_conflict"


# What a repeated pause or resume finds when an earlier (or racing) request already did it.
PAUSED_OR_PAUSING = (JobState.PAUSING, JobState.PAUSED)
GOING_TO_RUN = (JobState.QUEUED, JobState.STARTING, JobState.RUNNING, JobState.RESTARTING)


class IllegalTransition(StoreError):
    code = "illegal_transition"


class ConcurrentUpdate(StoreError):
    code = "concurrent_update"


def new_job_id() -> str:
    return uuid.uuid4().hex[:16]


# Timestamps that a transition into a state sets.
_STAMPS = {
    JobState.STARTING: "started_at",
    JobState.SUCCEEDED: "finished_at",
    JobState.FAILED: "finished_at",
    JobState.CANCELLED: "finished_at",
}


class JobStore:
    def __init__(self, db: Database) -> None:
        self.db = db

    # -- creating and reading --------------------------------------------------------

    def create(
        self,
        owner: Viewer,
        spec: JobSpec,
        idempotency_key: str | None = None,
        *,
        submitted: JobSpec | None = None,
        events: tuple[Event, ...] = (),
    ) -> tuple[Job, bool]:
        """Insert a QUEUED job; returns (job, created). Same key + same spec: the same job.

        `submitted` is the spec as sent where the stored one was completed from it (a
        layout chosen by `parallel: auto`): a replay is recognised by what was sent.
        `events` are recorded with the job, after its "submitted" event."""
        digest = spec_hash(submitted or spec)
        if idempotency_key is not None:
            existing = self._by_key(owner.id, idempotency_key)
            if existing is not None:
                return self._same_request(existing, digest), False
        job = Job(
            id=new_job_id(),
            owner_id=owner.id,
            name=spec.name,
            spec=spec.model_dump(mode="json"),
            state=JobState.QUEUED,
            version=1,
            priority=spec.priority,
            idempotency_key=idempotency_key,
            request_hash=digest,
            created_at=utcnow(),
        )
        with self.db.session() as s:
            s.add(job)
            s.add(
                _event(
                    job.id,
                    "submitted",
                    f"submitted by {owner.name}",
                    {"state": JobState.QUEUED.value},
                )
            )
            for event in events:
                s.add(_event(job.id, event.kind.value, event.message, event.stored_data()))
            try:
                s.commit()
            except IntegrityError:
                # Another request with the same key committed first: answer with its job.
                s.rollback()
                if idempotency_key is None:
                    raise
                existing = self._by_key(owner.id, idempotency_key)
                if existing is None:
                    raise
                return self._same_request(existing, digest), False
        log.info("job %s (%s) queued for %s", job.id, job.name, owner.name)
        return self.get(job.id), True

    def submitted_with_key(self, owner: Viewer, key: str | None) -> bool:
        """Whether `owner` already submitted a job under this Idempotency-Key."""
        return key is not None and self._by_key(owner.id, key) is not None

    def _by_key(self, owner_id: int, key: str) -> Job | None:
        with self.db.session() as s:
            return s.scalar(select(Job).where(Job.owner_id == owner_id, Job.idempotency_key == key))

    @staticmethod
    def _same_request(job: Job, digest: str) -> Job:
        if job.request_hash != digest:
            raise IdempotencyConflict(
                f"Idempotency-Key was already used for job {job.id} with a different spec; "
                "use a new key for a new job"
            )
        return job

    def get(self, job_id: str, viewer: Viewer | None = None) -> Job:
        """The job; a viewer who is neither its owner nor an admin gets JobNotFound."""
        with self.db.session() as s:
            # The owner in the same query (not a second one, as selectin would).
            job = s.get(Job, job_id, options=[joinedload(Job.owner)])
        if job is None or (
            viewer is not None and not viewer.is_admin and job.owner_id != viewer.id
        ):
            raise JobNotFound(f"no job {job_id}")
        return job

    def active_jobs(self) -> list[Job]:
        with self.db.session() as s:
            return list(s.scalars(select(Job).where(Job.state.in_([st.value for st in ACTIVE]))))

    # -- changing state --------------------------------------------------------------

    def transition(
        self,
        job_id: str,
        to: JobState,
        reason: str,
        *,
        expected_version: int | None = None,
        **fields: Any,
    ) -> Job:
        """Move the job to `to`, recording `reason` as an event.

        With `expected_version`, the move happens only if nobody changed the job since the
        caller read it. Extra `fields` (e.g. failure_reason) are written in the same update.
        """
        with self.db.session() as s:
            job = s.get(Job, job_id)
            if job is None:
                raise JobNotFound(f"no job {job_id}")
            src = JobState(job.state)
            version = job.version if expected_version is None else expected_version
            if job.version != version:
                raise ConcurrentUpdate(
                    f"job {job_id} changed since it was read (now "
                    f"{src.value}); read it again and retry"
                )
            if not is_legal(src, to):
                raise IllegalTransition(f"job {job_id} is {src.value}; it cannot become {to.value}")
            values: dict[str, Any] = {"state": to.value, "version": version + 1, **fields}
            if to in _STAMPS:
                values[_STAMPS[to]] = utcnow()
            _compare_and_set(
                s,
                job_id,
                (Job.version == version, Job.state == src.value),
                values,
                f"job {job_id} changed while moving it to {to.value}; read it again and retry",
            )
            s.add(_event(job_id, "state", reason, {"from": src.value, "to": to.value}))
            s.commit()
        log.info("job %s: %s -> %s (%s)", job_id, src.value, to.value, reason)
        return self.get(job_id)

    def request_cancel(self, job_id: str, viewer: Viewer, reason: str) -> Job:
        """Ask a job to stop. A QUEUED or PAUSED job has nothing running and is cancelled
        at once. Asking again, or at the same time as another request, is not an error:
        whoever loses the race gets the job as the winner left it."""
        job = self.get(job_id, viewer)
        state = JobState(job.state)
        if state in (JobState.CANCELLING, JobState.CANCELLED):
            return job
        if state.terminal:
            raise IllegalTransition(f"job {job_id} already ended ({state.value})")
        try:
            job = self.transition(job_id, JobState.CANCELLING, reason, expected_version=job.version)
        except ConcurrentUpdate:
            now = self.get(job_id)
            if now.state in (JobState.CANCELLING, JobState.CANCELLED):
                return now
            return self.request_cancel(job_id, viewer, reason)  # changed otherwise: retry
        if state in (JobState.QUEUED, JobState.PAUSED):
            try:
                job = self.transition(
                    job_id,
                    JobState.CANCELLED,
                    f"cancelled while {state.value}",
                    expected_version=job.version,
                )
            except (ConcurrentUpdate, IllegalTransition):
                job = self.get(job_id)  # someone else finished the cancel
        return job

    def request_pause(self, job_id: str, viewer: Viewer, reason: str) -> Job:
        """Ask a RUNNING job to checkpoint and free its workers (PAUSING, then PAUSED).
        Idempotent: a job already pausing or paused, by this request's racer or an
        earlier one, is answered as it is."""
        job = self.get(job_id, viewer)
        if job.state in PAUSED_OR_PAUSING:
            return job
        if job.state != JobState.RUNNING:
            raise IllegalTransition(
                f"job {job_id} is {job.state}; only a RUNNING job can be paused"
            )
        try:
            return self.transition(job_id, JobState.PAUSING, reason, expected_version=job.version)
        except ConcurrentUpdate:
            if (now := self.get(job_id, viewer)).state in PAUSED_OR_PAUSING:
                return now
            raise

    def request_resume(self, job_id: str, viewer: Viewer, reason: str) -> Job:
        """Queue a PAUSED job again; its new supervisor restores the pause's checkpoint.
        Idempotent: a job already on its way to run (queued again by a racer or an
        earlier request, or never paused) is answered as it is."""
        job = self.get(job_id, viewer)
        if job.state in GOING_TO_RUN:
            return job
        if job.state != JobState.PAUSED:
            raise IllegalTransition(
                f"job {job_id} is {job.state}; only a PAUSED job can be resumed"
                + (" (wait for PAUSED)" if job.state == JobState.PAUSING else "")
            )
        try:
            # The next supervisor numbers its progress from 1 again.
            return self.transition(
                job_id, JobState.QUEUED, reason, expected_version=job.version, reconciled_seq=0
            )
        except ConcurrentUpdate:
            if (now := self.get(job_id, viewer)).state in GOING_TO_RUN:
                return now
            raise

    def delete(self, job_id: str, viewer: Viewer) -> DeletedJob:
        """Delete an ended job's rows (events, metrics and checkpoint records go with it),
        keeping a `deleted_jobs` row of who deleted what and when. Refused while the job
        runs, and while a job that has not ended starts from its checkpoints."""
        job = self.get(job_id, viewer)
        if not JobState(job.state).terminal:
            raise IllegalTransition(
                f"job {job_id} is {job.state}; only an ended job can be deleted (cancel it first)"
            )
        waiting = [
            other.id
            for other in self.active_jobs()
            if (other.spec.get("resume_from") or {}).get("job_id") == job_id
        ]
        if waiting:
            raise IllegalTransition(
                f"job {job_id} is where job {waiting[0]} starts from (resume_from); delete "
                "it once that job has a checkpoint of its own, or cancel it"
            )
        record = DeletedJob(
            id=job.id,
            owner_id=job.owner_id,
            name=job.name,
            state=job.state,
            steps_trained=job.current_step,
            created_at=job.created_at,
            deleted_by_id=viewer.id,
        )
        with self.db.session() as s:
            try:
                s.add(record)
                s.flush()
            except IntegrityError:  # deleted by someone else a moment ago
                s.rollback()
                raise JobNotFound(f"no job {job_id}") from None
            # Its events, metrics and checkpoint rows go with it (ON DELETE CASCADE).
            gone = s.execute(delete(Job).where(Job.id == job_id, Job.version == job.version))
            if gone.rowcount != 1:  # type: ignore[attr-defined]
                s.rollback()
                raise ConcurrentUpdate(f"job {job_id} changed while deleting it; try again")
            s.commit()
            s.refresh(record)
        log.info("job %s deleted by user %d", job_id, viewer.id)
        return record

    def restart_supervisor(
        self, job_id: str, reason: str, *, expected_version: int, failures: int
    ) -> Job:
        """Record that the job's supervisor is being recreated: one more restart, the
        job's failures now `failures`, and the new supervisor's progress read from its
        first entry. A job STARTING or RUNNING becomes RESTARTING; one already RESTARTING
        stays so."""
        job = self.get(job_id)
        fields = {"restarts": job.restarts + 1, "failures": failures, "reconciled_seq": 0}
        if job.state != JobState.RESTARTING:
            return self.transition(
                job_id, JobState.RESTARTING, reason, expected_version=expected_version, **fields
            )
        with self.db.session() as s:
            _compare_and_set(
                s,
                job_id,
                (Job.version == expected_version,),
                {"version": expected_version + 1, **fields},
                f"job {job_id} changed while restarting its supervisor",
            )
            s.add(_event(job_id, "state", reason, {"from": job.state, "to": job.state}))
            s.commit()
        return self.get(job_id)

    def set_queue_reason(self, job_id: str, reason: str | None) -> None:
        """Why a QUEUED job waits; not a change of state, so no version bump."""
        with self.db.session() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id, Job.state == JobState.QUEUED.value)
                .values(queue_reason=reason)
            )
            s.commit()

    # -- what a job produced ----------------------------------------------------------

    def record_progress(
        self, job_id: str, entries: Sequence[ProgressEntry], *, after_seq: int
    ) -> int:
        """Write a supervisor's metrics, events and checkpoints in one transaction.

        Applies only if the job's `reconciled_seq` is still `after_seq` (so two readers
        cannot both write the same entries); returns the new `reconciled_seq`. State
        entries are the caller's to apply (`transition`): here they only advance the seq.
        A failure event sets the job's failures to the count it carries.
        """
        if not entries:
            return after_seq
        last_seq = entries[-1].seq
        with self.db.session() as s:
            steps = [e.step for e in entries if isinstance(e, MetricsEntry)]
            have = (
                set(
                    s.scalars(
                        select(JobMetric.step).where(
                            JobMetric.job_id == job_id, JobMetric.step.in_(steps)
                        )
                    )
                )
                if steps
                else set()
            )
            first_step = self._first_step(s, job_id, entries, have)
            if first_step is not None:
                s.add(_event(job_id, "event", first_step.message, first_step.stored_data()))
            latest: dict[str, Any] | None = None
            latest_checkpoint: str | None = None
            steps_lost, seconds_lost = 0, 0.0
            failures: int | None = None
            for e in entries:
                if isinstance(e, MetricsEntry) and e.step not in have:
                    s.add(JobMetric(job_id=job_id, step=e.step, values=e.values))
                    have.add(e.step)
                    latest = e.values
                elif isinstance(e, EventEntry):
                    s.add(_event(job_id, "event", e.message, e.data))
                    if e.data.get("kind") == EventKind.FAILURE:  # the job's count after it
                        failures = int(e.data["failures"])
                    if e.data.get("kind") == EventKind.RECOVERY:  # counted with its seq: once
                        steps_lost += int(e.data["steps_lost"])
                        seconds_lost += float(e.data["seconds_lost"])
                elif isinstance(e, SummaryEntry):
                    s.add(_event(job_id, "summary", "training summary", e.summary))
                elif isinstance(e, CheckpointEntry):
                    latest_checkpoint = self._add_checkpoint(s, job_id, e.commit)
            values: dict[str, Any] = {"reconciled_seq": last_seq}
            if failures is not None:
                values["failures"] = failures
            if latest is not None:
                # The per-rank breakdown stays in the step's row: the job row is read by
                # every listing, and its size would grow with the world.
                brief = {k: v for k, v in latest.items() if k != "breakdown"}
                values.update(latest_metrics=brief, current_step=latest["step"])
            if latest_checkpoint is not None:
                values["latest_checkpoint"] = latest_checkpoint
            if steps_lost or seconds_lost:
                values.update(
                    steps_lost=Job.steps_lost + steps_lost,
                    seconds_lost=Job.seconds_lost + seconds_lost,
                )
            _compare_and_set(
                s,
                job_id,
                (Job.reconciled_seq == after_seq,),
                values,
                f"job {job_id}: progress after {after_seq} was already recorded",
            )
            s.commit()
        return last_seq

    @staticmethod
    def _first_step(
        s: Session, job_id: str, entries: Sequence[ProgressEntry], have: set[int]
    ) -> Event | None:
        """The event for the job's first step ever recorded (not a restart's, not a step
        written again): seconds from submit to the step's end, by the worker's clock."""
        first = next(
            (e for e in entries if isinstance(e, MetricsEntry) and e.step not in have), None
        )
        if first is None:
            return None
        row = s.execute(
            select(Job.created_at, Job.current_step).where(Job.id == job_id)
        ).one_or_none()
        if row is None or row.current_step != 0:
            return None
        created = row.created_at
        if created.tzinfo is None:  # SQLite keeps no zone; it was stored in UTC
            created = created.replace(tzinfo=UTC)
        ended = float(first.values.get("time", utcnow().timestamp()))
        seconds = max(ended - created.timestamp(), 0.0)
        return Event(
            EventKind.FIRST_STEP,
            f"first step {seconds:.1f} s after submit",
            {"seconds": round(seconds, 3), "step": first.step},
        )

    @staticmethod
    def _add_checkpoint(s: Session, job_id: str, commit: CheckpointCommit) -> str:
        """A committed checkpoint's row (again for the same step: the newer save wins)."""
        s.execute(
            delete(Checkpoint).where(Checkpoint.job_id == job_id, Checkpoint.step == commit.step)
        )
        s.add(
            Checkpoint(
                job_id=job_id,
                step=commit.step,
                path=commit.path,
                bytes=commit.bytes,
                layout=commit.layout[:128],
                committed=True,
                save_s=commit.save_s,
                blocking_s=commit.blocking_s,
            )
        )
        # Checkpoints that keep_last deleted are not restorable any more.
        if commit.deleted:
            s.execute(
                delete(Checkpoint).where(
                    Checkpoint.job_id == job_id, Checkpoint.step.in_(commit.deleted)
                )
            )
        return commit.path

    def add_event(
        self, job_id: str, kind: str, message: str, data: dict[str, Any] | None = None
    ) -> None:
        with self.db.session() as s:
            s.add(_event(job_id, kind, message, data))
            s.commit()

    def events(self, job_id: str, *, after_id: int = 0, limit: int = 200) -> list[JobEvent]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(JobEvent)
                    .where(JobEvent.job_id == job_id, JobEvent.id > after_id)
                    .order_by(JobEvent.id)
                    .limit(limit)
                )
            )

    def checkpoints(self, job_id: str) -> list[Checkpoint]:
        with self.db.session() as s:
            return list(
                s.scalars(
                    select(Checkpoint)
                    .where(Checkpoint.job_id == job_id, Checkpoint.committed.is_(True))
                    .order_by(Checkpoint.step)
                )
            )


def _compare_and_set(
    s: Session,
    job_id: str,
    expected: tuple[ColumnElement[bool], ...],
    values: dict[str, Any],
    conflict: str,
) -> None:
    """Update the job's row with `values` only where it still holds what the caller read
    (`expected`: its version, its state, its reconciled seq); else roll back and raise
    ConcurrentUpdate(`conflict`): two writers can never both win."""
    result = s.execute(update(Job).where(Job.id == job_id, *expected).values(**values))
    if result.rowcount != 1:  # type: ignore[attr-defined]
        s.rollback()
        raise ConcurrentUpdate(conflict)


def _event(job_id: str, kind: str, message: str, data: dict[str, Any] | None) -> JobEvent:
    return JobEvent(job_id=job_id, kind=kind, message=message, data=data, time=utcnow())
