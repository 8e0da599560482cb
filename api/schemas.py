"""What the API returns: one schema family per resource, never the ORM rows."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Annotated, Any, overload

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
)

from shardline.api.stored_json import StoredJson
from shardline.service.job_views import JobView
from shardline.service.models import Checkpoint, Job, JobEvent
from shardline.service.profiles import MAX_STEPS as MAX_PROFILE_STEPS
from shardline.workers.contract.faults import FaultKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.scalars import refuse_coercion
from shardline.workers.contract.sections import ModelSpec


def utc(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; every stored time is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


@overload
def job_relative(path: str) -> str: ...
@overload
def job_relative(path: None) -> None: ...
def job_relative(path: str | None) -> str | None:
    """A path of the job's storage as the user sees it, relative to the job's folder
    (`checkpoints/step-00000004`): where the server keeps it is not the user's business."""
    if path is None:
        return None
    return "/".join(path.rstrip("/").split("/")[-2:])


def json_safe(value: Any) -> Any:
    """`value` with what JSON responses cannot carry replaced: non-finite floats become
    None, characters UTF-8 cannot encode (lone surrogates) "?". Rows stored before the
    spec refused them must still list, read and cancel, not fail every listing."""
    try:
        # Nearly every stored value is clean: one pass of the C encoder says so, far
        # cheaper than walking it in Python (the walk was most of a listing's time).
        json.dumps(value, allow_nan=False, ensure_ascii=False).encode("utf-8")
        return value
    except (ValueError, TypeError, RecursionError):  # UnicodeEncodeError is a ValueError
        return _json_safe(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, str):
        return value.encode("utf-8", "replace").decode("utf-8")
    if isinstance(value, dict):
        return {_json_safe(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_json_safe(v) for v in value]
    return value


class ErrorInfo(BaseModel):
    code: str
    message: str
    # Validation errors: [{"field": "train.lr", "message": ...}]; otherwise usually null.
    details: Any = None


class ErrorBody(BaseModel):
    """Every failure, whatever its status: {"error": {"code", "message", "details"}}."""

    error: ErrorInfo


def _iso_utc(value: datetime) -> str:
    return value.replace(tzinfo=UTC).isoformat() if value.tzinfo is None else value.isoformat()


# A stored time in JSON: ISO 8601 in UTC (SQLite hands back naive datetimes; every stored
# time is UTC). Typed, so the OpenAPI document says `date-time` for it.
UtcTime = Annotated[
    datetime,
    PlainSerializer(_iso_utc, return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "format": "date-time"}, mode="serialization"),
]


class JobPublic(BaseModel):
    id: str
    name: str
    owner: str
    state: JobState
    priority: int
    created_at: UtcTime
    started_at: UtcTime | None
    finished_at: UtcTime | None
    step: int
    steps: int
    restarts: int
    # Real failures so far, against spec.fault_tolerance.max_failures (restarts also
    # count non-finite rollbacks and elastic grow-backs, which spend nothing).
    failures: int
    # What recoveries cost: steps trained again, seconds lost, and goodput (the share of
    # the wall time since the job started that went into training it kept).
    steps_lost: int
    seconds_lost: float
    goodput: float | None
    failure_reason: str | None
    queue_reason: str | None
    latest_metrics: dict[str, Any] | None
    latest_checkpoint: str | None
    version: int
    spec: dict[str, Any]
    # The model's whole shape (a preset's values with the spec's overrides, or a model
    # folder's), for comparing jobs: given for one job (GET, and what a write returns),
    # not in listings.
    model_shape: dict[str, Any] | None = None

    @classmethod
    def of(cls, job: Job | JobView) -> JobPublic:
        """A job as the API reports it: from a read's view, or the row a write returned."""
        view = JobView.of(job) if isinstance(job, Job) else job
        fields = cls.one(view)
        fields["latest_metrics"] = json_safe(fields["latest_metrics"])
        fields["spec"] = json_safe(view.spec)
        return cls(**fields)

    @classmethod
    def one(cls, job: JobView) -> dict[str, Any]:
        """`fields` of one job, with its model's shape (GET /v1/jobs/{id}, writes)."""
        return {**cls.fields(job), "model_shape": model_shape(job)}

    @staticmethod
    def fields(job: JobView) -> dict[str, Any]:
        """The job's fields as plain values, for `api.json_body` to encode without building
        the model (the polled reads); `of` validates the same dict."""
        return {
            "id": job.id,
            "name": job.name,
            "owner": job.owner,
            "state": job.state,
            "priority": job.priority,
            "created_at": job.created_at,
            "started_at": job.started_at,
            "finished_at": job.finished_at,
            "step": job.current_step,
            "steps": job.steps,
            "restarts": job.restarts,
            "failures": job.failures,
            "steps_lost": job.steps_lost,
            "seconds_lost": job.seconds_lost,
            "goodput": goodput(job),
            "failure_reason": job.failure_reason,
            "queue_reason": job.queue_reason,
            "latest_metrics": job.latest_metrics,
            "latest_checkpoint": job_relative(job.latest_checkpoint),
            "version": job.version,
            "spec": StoredJson.of(job.spec_text),
            "model_shape": None,  # GET /v1/jobs/{id} fills it in
        }


def model_shape(job: JobView) -> dict[str, Any] | None:
    """The job's model as resolved from its spec (None where the stored spec no longer
    reads as one)."""
    try:
        return ModelSpec.model_validate(job.spec.get("model", {})).resolved()
    except (ValueError, KeyError):
        return None


def goodput(job: JobView) -> float | None:
    """Productive time over wall time since the job started (until it ended): the wall
    time less the seconds recoveries lost. None before the job has started."""
    started = utc(job.started_at)
    if started is None:
        return None
    wall = ((utc(job.finished_at) or datetime.now(UTC)) - started).total_seconds()
    if wall <= 0:
        return None
    return min(max((wall - job.seconds_lost) / wall, 0.0), 1.0)


class DeletedJobPublic(BaseModel):
    """A deleted job: what is kept of it. `files_removed` is false where its storage
    could not be reached; its files are then left for an operator."""

    id: str
    name: str
    state: JobState
    steps_trained: int
    deleted_at: UtcTime
    files_removed: bool


class JobsPublic(BaseModel):
    jobs: list[JobPublic]
    next_cursor: str | None


class EventPublic(BaseModel):
    id: int
    time: UtcTime
    kind: str
    message: str
    data: dict[str, Any] | None

    @classmethod
    def of(cls, e: JobEvent) -> EventPublic:
        return cls(id=e.id, time=e.time, kind=e.kind, message=e.message, data=e.data)


class EventsPublic(BaseModel):
    events: list[EventPublic]


class MetricsPublic(BaseModel):
    # Each row: {"step": n, "loss": ..., "grad_norm": ..., ...}.
    metrics: list[dict[str, Any]]

    @classmethod
    def of(cls, steps: list[tuple[int, dict[str, Any]]]) -> MetricsPublic:
        """From (step, values) pairs, as `JobViews.metrics` reads them."""
        return cls(**cls.rows(steps))

    @staticmethod
    def rows(steps: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
        """The same as plain values, for `api.json_body`."""
        return {"metrics": [{**values, "step": step} for step, values in steps]}


class CheckpointPublic(BaseModel):
    """A committed checkpoint: `created_at` is when it was committed."""

    step: int
    path: str
    bytes: int
    created_at: UtcTime
    layout: str
    save_s: float | None
    blocking_s: float | None

    @classmethod
    def of(cls, c: Checkpoint) -> CheckpointPublic:
        return cls(
            step=c.step,
            path=job_relative(c.path),
            bytes=c.bytes,
            created_at=c.created_at,
            layout=c.layout,
            save_s=c.save_s,
            blocking_s=c.blocking_s,
        )


class CheckpointsPublic(BaseModel):
    checkpoints: list[CheckpointPublic]


class LogsPublic(BaseModel):
    rank: int
    lines: list[str]
    ranks: list[int]


class HoldingPublic(BaseModel):
    """One job's ranks on one node; another user's job is not named to a non-admin."""

    job_id: str | None
    name: str | None
    ranks: int
    resources: dict[str, float]


class NodePublic(BaseModel):
    node_id: str
    address: str
    alive: bool
    resources: dict[str, float]
    held: list[HoldingPublic]


class QueuedPublic(BaseModel):
    position: int  # in admission order among every user's queued jobs, 1 first
    id: str
    name: str
    owner: str
    priority: int
    created_at: UtcTime
    reason: str | None


class ClusterPublic(BaseModel):
    runtime: str
    connected: bool
    message: str
    resources: dict[str, float]
    available: dict[str, float]
    jobs: dict[str, int]
    nodes: list[NodePublic] = []
    queue: list[QueuedPublic] = []


class ProfileCreate(BaseModel):
    """POST /v1/jobs/{id}/profile: how many of the next steps every rank records."""

    model_config = ConfigDict(extra="forbid")

    steps: Annotated[int, Field(ge=1, le=MAX_PROFILE_STEPS)] = 3

    @field_validator("steps", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return refuse_coercion({int}, value)


class ProfilePublic(BaseModel):
    id: str
    job_id: str
    steps: int
    world_size: int
    state: str  # recording, done or failed
    ranks_done: list[int]
    requested_at: UtcTime
    error: str | None
    trace: str | None  # where the merged trace is, once done


class JobPatch(BaseModel):
    """PATCH /v1/jobs/{id}: what may change on a job that has not ended."""

    model_config = ConfigDict(extra="forbid")

    priority: Annotated[int, Field(ge=-1000, le=1000)]

    @field_validator("priority", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return refuse_coercion({int}, value)


class FaultCreate(BaseModel):
    """POST /v1/jobs/{id}/faults: which failure, on which rank."""

    model_config = ConfigDict(extra="forbid")

    kind: FaultKind
    rank: Annotated[int, Field(ge=0, le=1_000_000)] = 0

    @field_validator("rank", mode="before")
    @classmethod
    def _a_number(cls, value: Any) -> Any:
        return refuse_coercion({int}, value)  # "0" and true are not rank 0 or 1
