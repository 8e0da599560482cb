"""The queue as users see it: queued jobs in the order the scheduler considers them, and
changing a job's priority (which changes that order)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select, update

from shardline.service.db import Database
from shardline.service.models import Job, JobEvent, User, utcnow
from shardline.service.principal import Viewer
from shardline.service.scheduler import admission_key
from shardline.service.store import ConcurrentUpdate, IllegalTransition, JobStore, StoreError
from shardline.workers.contract.events import EventKind
from shardline.workers.contract.lifecycle import ACTIVE, JobState

log = logging.getLogger(__name__)


class PriorityRefused(StoreError):
    """A user who is not an administrator asked to raise a job's priority (the API: 403)."""

    code = "forbidden"


@dataclass(frozen=True)
class QueuedJob:
    position: int  # 1 = considered first, among every user's queued jobs
    id: str
    name: str
    owner: str
    priority: int
    created_at: datetime
    reason: str | None  # why it still waits, as the scheduler last said


def queued_in_order(db: Database, viewer: Viewer) -> list[QueuedJob]:
    """QUEUED jobs in admission order: every user's for an administrator, the viewer's own
    for anyone else (with their positions among all, so they see how far back they are)."""
    # The columns shown, not the rows: the page asks every 2 s, and a spec can be large.
    query = (
        select(
            Job.id,
            Job.name,
            User.name.label("owner"),
            Job.owner_id,
            Job.priority,
            Job.created_at,
            Job.queue_reason,
        )
        .join(User, Job.owner_id == User.id)
        .where(Job.state == JobState.QUEUED.value)
    )
    with db.session() as s:
        rows = s.execute(query).all()
    ordered = sorted(rows, key=admission_key)
    return [
        QueuedJob(i, r.id, r.name, r.owner, r.priority, r.created_at, r.queue_reason)
        for i, r in enumerate(ordered, start=1)
        if viewer.is_admin or r.owner_id == viewer.id
    ]


def set_priority(store: JobStore, job_id: str, viewer: Viewer, priority: int) -> Job:
    """Give a job that has not ended a new priority; its next admission uses it. An
    administrator may set any; an owner may only lower their own (raising it would let
    anyone jump the queue)."""
    job = store.get(job_id, viewer)
    if JobState(job.state) not in ACTIVE:
        raise IllegalTransition(
            f"job {job_id} is {job.state}; only a job that has not ended has a priority to change"
        )
    if priority == job.priority:
        return job
    if priority > job.priority and not viewer.is_admin:
        raise PriorityRefused(
            f"only an administrator can raise a job's priority (from {job.priority} to "
            f"{priority}); you may lower your own"
        )
    with store.db.session() as s:
        # Only from the priority that was checked: a racing change makes this one retry.
        done = s.execute(
            update(Job)
            .where(
                Job.id == job_id,
                Job.priority == job.priority,
                Job.state.in_([st.value for st in ACTIVE]),
            )
            .values(priority=priority)
        )
        if done.rowcount != 1:  # type: ignore[attr-defined]
            s.rollback()
            raise ConcurrentUpdate(
                f"job {job_id} changed meanwhile (its priority, or it ended); read it again"
            )
        message = f"priority {job.priority} -> {priority}, set by {viewer.name}"
        kind = EventKind.PRIORITY.value
        data = {"kind": kind, "from": job.priority, "to": priority, "by": viewer.name}
        s.add(JobEvent(job_id=job_id, kind=kind, message=message, data=data, time=utcnow()))
        s.commit()
    log.info("job %s: %s", job_id, message)
    return store.get(job_id)
