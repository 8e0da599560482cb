"""Database tables (SQLAlchemy 2 typed ORM). Never returned by the API directly."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Stable constraint names, so Alembic migrations work the same on SQLite and PostgreSQL.
NAMING = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}


def utcnow() -> datetime:
    return datetime.now(UTC)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {dict[str, Any]: JSON, datetime: DateTime(timezone=True)}


class User(Base):
    __tablename__ = "users"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)

    tokens: Mapped[list[ApiToken]] = relationship(back_populates="user")


class ApiToken(Base):
    """A bearer token. Only its SHA-256 is stored; the token itself is shown once."""

    __tablename__ = "api_tokens"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    user_id: Mapped[int] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), index=True)
    name: Mapped[str] = mapped_column(String(64))
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)
    # The first characters, so a user can tell tokens apart in `token list`.
    prefix: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    revoked_at: Mapped[datetime | None] = mapped_column(default=None)

    user: Mapped[User] = relationship(back_populates="tokens")


class Job(Base):
    __tablename__ = "jobs"
    __table_args__ = (
        UniqueConstraint("owner_id", "idempotency_key", name="uq_jobs_owner_idempotency_key"),
        Index("ix_jobs_state_priority", "state", "priority"),
        # A user's listing, newest first (JobViews.page), straight from the index.
        Index("ix_jobs_owner_created", "owner_id", "created_at", "id"),
    )

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    spec: Mapped[dict[str, Any]] = mapped_column(JSON)
    state: Mapped[str] = mapped_column(String(16), index=True)
    # Bumped by every change of state: the compare-and-swap that lets only one writer win.
    version: Mapped[int] = mapped_column(Integer, default=1)
    priority: Mapped[int] = mapped_column(Integer, default=0)
    idempotency_key: Mapped[str | None] = mapped_column(String(255), default=None)
    # SHA-256 of the submitted spec: same key + other body is a conflict.
    request_hash: Mapped[str] = mapped_column(String(64))
    created_at: Mapped[datetime] = mapped_column(default=utcnow, index=True)
    started_at: Mapped[datetime | None] = mapped_column(default=None)
    finished_at: Mapped[datetime | None] = mapped_column(default=None)
    # Every restart, whatever its cause (a failure, a non-finite rollback, a grow-back).
    restarts: Mapped[int] = mapped_column(Integer, default=0)
    # Real failures only: the one budget fault_tolerance.max_failures limits, read by
    # every supervisor of the job and by the reconciler.
    failures: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    failure_reason: Mapped[str | None] = mapped_column(Text, default=None)
    # Why a QUEUED job is still waiting, for users to see.
    queue_reason: Mapped[str | None] = mapped_column(Text, default=None)
    current_step: Mapped[int] = mapped_column(Integer, default=0)
    latest_metrics: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)
    latest_checkpoint: Mapped[str | None] = mapped_column(Text, default=None)
    # The last entry of the supervisor's progress buffer written here; the reconciler
    # resumes after it, so a control-plane restart neither repeats nor skips an entry.
    reconciled_seq: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # What recoveries cost (added up from their events): steps trained again, and the
    # seconds from each failure until training was back where it had been.
    steps_lost: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    seconds_lost: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")

    # Always loaded with the job: every response names its owner.
    owner: Mapped[User] = relationship(lazy="selectin")


class DeletedJob(Base):
    """What is kept of a deleted job: which it was, whose, how far it trained, and who
    deleted it when. Its rows, logs, metrics and checkpoints are gone."""

    __tablename__ = "deleted_jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    owner_id: Mapped[int] = mapped_column(ForeignKey("users.id"), index=True)
    name: Mapped[str] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    steps_trained: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column()
    deleted_by_id: Mapped[int] = mapped_column(ForeignKey("users.id"))
    deleted_at: Mapped[datetime] = mapped_column(default=utcnow)


class JobEvent(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    time: Mapped[datetime] = mapped_column(default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    message: Mapped[str] = mapped_column(Text)
    data: Mapped[dict[str, Any] | None] = mapped_column(JSON, default=None)


class JobMetric(Base):
    """One logged step of one job; (job, step) is unique so a replay cannot duplicate it."""

    __tablename__ = "job_metrics"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_job_metrics_job_step"),)

    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    values: Mapped[dict[str, Any]] = mapped_column(JSON)


class Checkpoint(Base):
    __tablename__ = "checkpoints"
    __table_args__ = (UniqueConstraint("job_id", "step", name="uq_checkpoints_job_step"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    step: Mapped[int] = mapped_column(Integer)
    path: Mapped[str] = mapped_column(Text)
    bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(default=utcnow)
    layout: Mapped[str] = mapped_column(String(128))
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    # How long the save took, and how long of that training was held (async saves).
    save_s: Mapped[float | None] = mapped_column(Float, default=None)
    blocking_s: Mapped[float | None] = mapped_column(Float, default=None)


class ClusterRates(Base):
    """The cost model's rates measured on this cluster, one row per device class ("cpu",
    "gpu"): `parallel: auto`, POST /v1/plan and their events use them over the defaults."""

    __tablename__ = "cluster_rates"

    kind: Mapped[str] = mapped_column(String(16), primary_key=True)
    rates: Mapped[dict[str, Any]] = mapped_column(JSON)
    measured_at: Mapped[datetime] = mapped_column(default=utcnow)
    source: Mapped[str] = mapped_column(Text)  # how they were measured, and by whom
