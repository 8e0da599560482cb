"""Jobs as readers see them: the status, listing and permission reads every client polls.

These are the API's hottest reads, so they are Core selects of exactly the columns a
response needs, joined with the owner's name, without building ORM objects (an ORM load of
one job cost 6 times the SQL it ran). Writes, and anything that needs a `Job` row, stay in
`JobStore`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Select,
    Text,
    and_,
    bindparam,
    case,
    cast,
    func,
    or_,
    select,
)
from sqlalchemy.orm import aliased

from shardline.service.db import Database, load_stored_json
from shardline.service.models import ApiToken, Job, JobMetric, User
from shardline.service.principal import Principal, Viewer
from shardline.service.store import JobNotFound
from shardline.workers.contract.lifecycle import JobState


@dataclass(frozen=True, slots=True)
class JobView:
    """A job's row and its owner's name, as the API reports them."""

    id: str
    owner_id: int
    owner: str
    name: str
    # The spec as stored (JSON text), served as it is: decoding and encoding it again was
    # most of a listing's work. `steps` (last) is read from it by the database.
    spec_text: str
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
    steps: int

    @property
    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = load_stored_json(self.spec_text)
        return spec

    @classmethod
    def of(cls, job: Job) -> JobView:
        """The view of a row a write returned (its owner loaded)."""
        return cls(
            **{f: getattr(job, f) for f in _ROW_FIELDS},
            owner=job.owner.name,
            spec_text=json.dumps(job.spec),
            steps=spec_steps(job.spec),
        )

    @classmethod
    def of_row(cls, row: Sequence[Any]) -> JobView:
        """A view of a row of `_select_view`, whose columns are the fields in order."""
        return cls(*row[:-1], _as_steps(row[-1]))  # type: ignore[call-arg]


def spec_steps(spec: Any) -> int:
    """`train.steps` of a stored spec; 0 for one that cannot be read (the job is still
    listed, it just has no step count)."""
    try:
        return _as_steps(spec.get("train", {}).get("steps", 0))
    except AttributeError:
        return 0


def _as_steps(value: Any) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0


@dataclass(frozen=True, slots=True)
class ViewPage:
    jobs: list[JobView]
    next_cursor: str | None


# The columns a view takes as they are; the owner's name, the spec's text and its step
# count are selected as expressions. `steps` comes as text (PostgreSQL) or a number
# (SQLite): read in Python, where a bad stored value is 0, not a failed statement.
_ROW_FIELDS = tuple(
    f for f in JobView.__dataclass_fields__ if f not in ("owner", "spec_text", "steps")
)
_STEPS_PATH = ("train", "steps")


def _view_columns(sqlite: bool, owner: Any) -> list[ColumnElement[Any]]:
    """A view's columns in its fields' order, the owner's name from `owner` (users or an
    alias of it). SQLite fails the whole statement on a stored text that is not JSON (a
    row stored before specs refused NaN): there the step count is read only from valid
    JSON (its CASE evaluates no other branch). PostgreSQL's json type holds only JSON."""
    steps: ColumnElement[Any] = Job.spec[_STEPS_PATH].as_string()
    if sqlite:
        steps = case((func.json_valid(Job.spec) == 1, steps))
    computed = {
        "owner": owner.name.label("owner"),
        "spec_text": cast(Job.spec, Text).label("spec_text"),
        "steps": steps.label("steps"),
    }
    return [computed[f] if f in computed else getattr(Job, f) for f in JobView.__dataclass_fields__]


# Built once with bound parameters: a statement built per call costs more to look up in
# SQLAlchemy's compiled cache than the read itself.
@functools.cache
def _select_view(sqlite: bool) -> Select[Any]:
    return select(*_view_columns(sqlite, User)).join(User, User.id == Job.owner_id)


@functools.cache
def _get_view(sqlite: bool) -> Select[Any]:
    return _select_view(sqlite).where(Job.id == bindparam("job_id"))


@functools.cache
def _get_view_for_token(sqlite: bool) -> Select[Any]:
    """The live token's user, then the job's view (all NULL where there is no such job):
    no row at all for an unknown or revoked token."""
    owner = aliased(User, name="owner")
    return (
        select(User.id, User.name, User.is_admin, *_view_columns(sqlite, owner))
        .select_from(ApiToken)
        .join(User, User.id == ApiToken.user_id)
        .outerjoin(Job, Job.id == bindparam("job_id"))
        .outerjoin(owner, owner.id == Job.owner_id)
        .where(ApiToken.token_hash == bindparam("token_hash"), ApiToken.revoked_at.is_(None))
    )


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
        self._sqlite = db.engine.dialect.name == "sqlite"

    def get(self, job_id: str, viewer: Viewer | None = None) -> JobView:
        """The job; a viewer who is neither its owner nor an admin gets JobNotFound, as
        for a job that does not exist (which jobs exist is nobody else's business)."""
        with self.db.reader() as conn:
            row = conn.execute(_get_view(self._sqlite), {"job_id": job_id}).one_or_none()
        if row is None or not _may_see(viewer, row.owner_id):
            raise JobNotFound(f"no job {job_id}")
        return JobView.of_row(row)

    def get_for_token(
        self, job_id: str, token_hash: str
    ) -> tuple[Principal | None, JobView | None]:
        """(the live token's user, the job as `get` reads it for them) in one statement: a
        job's status is the read every client polls, and on PostgreSQL a round trip costs
        more than either lookup. The user is None for an unknown or revoked token; the job
        is None where `get` raises JobNotFound."""
        params = {"job_id": job_id, "token_hash": token_hash}
        with self.db.reader() as conn:
            row = conn.execute(_get_view_for_token(self._sqlite), params).one_or_none()
        if row is None:
            return None, None
        user = Principal(row[0], row[1], row[2])
        if row[3] is None:  # the view's first column, the job's id: no such job
            return user, None
        view = JobView.of_row(row[3:])
        return user, view if _may_see(user, view.owner_id) else None

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
        query = _page_query(self._sqlite, viewer.is_admin, state is not None, cursor is not None)
        with self.db.reader() as conn:
            jobs = [JobView.of_row(row) for row in conn.execute(query, params)]
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
def _page_query(sqlite: bool, admin: bool, by_state: bool, after_cursor: bool) -> Select[Any]:
    """One statement per kind of listing, built once (see _get_view)."""
    query = _select_view(sqlite)
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
