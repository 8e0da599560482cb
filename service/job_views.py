"""Jobs as readers see them: the status, listing and permission reads every client polls.

These are the API's hottest reads, so they are Core selects of exactly the columns a
response needs, joined with the owner's name, without building ORM objects (an ORM load of
one job cost 6 times the SQL it ran). Writes, and anything that needs a `Job` row, stay in
`JobStore`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, Connection, Select, and_, bindparam, or_, select

from service.db import Database
from service.models import Job, JobMetric, User
from service.principal import Viewer
from service.store import JobNotFound
from workers.contract.lifecycle import JobState


@dataclass(frozen=True, slots=True)
class JobView:
    """A job's row and its owner's name, as the API reports them."""

    id: str
    owner_id: int
    owner: str
    name: str
    spec: dict[str, Any]
    state: str
    version: int
    priority: int
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    restarts: int
    failures: int
    failure_reason: str | None
    queue_reason: str | None
    current_step: int
    latest_metrics: dict[str, Any] | None
    latest_checkpoint: str | None
    steps_lost: int
    seconds_lost: float

    @classmethod
    def of(cls, job: Job) -> JobView:
        """The view of a row a write returned (its owner loaded)."""
        return cls(**{f: getattr(job, f) for f in _JOB_FIELDS}, owner=job.owner.name)


@dataclass(frozen=True, slots=True)
class ViewPage:
    jobs: list[JobView]
    next_cursor: str | None


_JOB_FIELDS = tuple(f for f in JobView.__dataclass_fields__ if f != "owner")
_SELECT_VIEW = select(*(getattr(Job, f) for f in _JOB_FIELDS), User.name.label("owner")).join(
    User, User.id == Job.owner_id
)


# Built once with bound parameters: a statement built per call costs more to look up in
# SQLAlchemy's compiled cache than the read itself.
_GET_VIEW = _SELECT_VIEW.where(Job.id == bindparam("job_id"))
_GET_OWNER = select(Job.owner_id).where(Job.id == bindparam("job_id"))
_METRICS = (
    select(JobMetric.step, JobMetric.values)
    .where(JobMetric.job_id == bindparam("job_id"), JobMetric.step > bindparam("since_step"))
    .order_by(JobMetric.step)
    .limit(bindparam("limit"))
)


def _may_see(viewer: Viewer | None, owner_id: int) -> bool:
    return viewer is None or viewer.is_admin or owner_id == viewer.id


def _require_visible(conn: Connection, job_id: str, viewer: Viewer) -> None:
    """JobNotFound unless `viewer` may see the job: one indexed read of its owner."""
    owner_id = conn.scalar(_GET_OWNER, {"job_id": job_id})
    if owner_id is None or not _may_see(viewer, owner_id):
        raise JobNotFound(f"no job {job_id}")


def encode_cursor(job: JobView) -> str:
    return f"{job.created_at.isoformat()}|{job.id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    try:
        created, job_id = cursor.split("|", 1)
        return datetime.fromisoformat(created), job_id
    except ValueError as err:
        raise ValueError("cursor: not a cursor returned by this API") from err


class JobViews:
    def __init__(self, db: Database) -> None:
        self.db = db

    def get(self, job_id: str, viewer: Viewer | None = None) -> JobView:
        """The job; a viewer who is neither its owner nor an admin gets JobNotFound, as
        for a job that does not exist (which jobs exist is nobody else's business)."""
        with self.db.reader() as conn:
            row = conn.execute(_GET_VIEW, {"job_id": job_id}).one_or_none()
        if row is None or not _may_see(viewer, row.owner_id):
            raise JobNotFound(f"no job {job_id}")
        return JobView(**row._mapping)

    def check_visible(self, job_id: str, viewer: Viewer) -> None:
        """JobNotFound unless `viewer` may see the job."""
        with self.db.reader() as conn:
            _require_visible(conn, job_id, viewer)

    def page(
        self,
        viewer: Viewer,
        *,
        state: JobState | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> ViewPage:
        """Newest first; `cursor` is the opaque `next_cursor` of the previous page
        (ValueError if it is not one)."""
        params: dict[str, Any] = {"owner_id": viewer.id, "limit": limit + 1}
        if state is not None:
            params["state"] = state.value
        if cursor is not None:
            params["created"], params["after_id"] = decode_cursor(cursor)
        query = _page_query(viewer.is_admin, state is not None, cursor is not None)
        with self.db.reader() as conn:
            jobs = [JobView(**row._mapping) for row in conn.execute(query, params)]
        more = len(jobs) > limit
        jobs = jobs[:limit]
        return ViewPage(jobs, encode_cursor(jobs[-1]) if more else None)

    def metrics(
        self, job_id: str, viewer: Viewer, *, since_step: int = 0, limit: int = 1000
    ) -> list[tuple[int, dict[str, Any]]]:
        """(step, values) of the steps logged after `since_step`, in order; JobNotFound
        unless `viewer` may see the job (checked on the same connection)."""
        with self.db.reader() as conn:
            _require_visible(conn, job_id, viewer)
            rows = conn.execute(
                _METRICS, {"job_id": job_id, "since_step": since_step, "limit": limit}
            )
            return [(row.step, row.values) for row in rows]


@functools.cache
def _page_query(admin: bool, by_state: bool, after_cursor: bool) -> Select[Any]:
    """One statement per kind of listing, built once (see _GET_VIEW)."""
    query = _SELECT_VIEW
    if not admin:
        query = query.where(Job.owner_id == bindparam("owner_id"))
    if by_state:
        query = query.where(Job.state == bindparam("state"))
    if after_cursor:
        created: BindParameter[datetime] = bindparam("created")
        after_id: BindParameter[str] = bindparam("after_id")
        query = query.where(
            or_(Job.created_at < created, and_(Job.created_at == created, Job.id < after_id))
        )
    return query.order_by(Job.created_at.desc(), Job.id.desc()).limit(bindparam("limit"))
