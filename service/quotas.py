"""Per-user quotas: how many jobs a user may have QUEUED, and what their started jobs
may hold (CPUs, GPUs). The queued limit is checked at submit; the resource quota by the
scheduler (a job over it stays QUEUED with the reason) and at submit for a job that could
never fit it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import func, select

from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.models import Job
from shardline.service.principal import Viewer
from shardline.workers.contract.lifecycle import JobState

T = TypeVar("T")

# Resource name -> the setting that limits it, as users see it in messages.
QUOTA_SETTINGS = {"CPU": "SHARDLINE_USER_MAX_CPUS", "GPU": "SHARDLINE_USER_MAX_GPUS"}

# A client over the queued-jobs limit can try again once some of its jobs have started.
QUEUED_RETRY_AFTER_S = 30


class QuotaExceeded(Exception):
    """A submit over a user's queued-jobs limit (the API answers 429)."""

    code = "quota_exceeded"
    retry_after_s = QUEUED_RETRY_AFTER_S


def resource_limits(settings: Settings) -> dict[str, float]:
    """The per-user resource quota; a resource with 0 (no limit) is left out."""
    limits = {"CPU": settings.user_max_cpus, "GPU": settings.user_max_gpus}
    return {k: v for k, v in limits.items() if v > 0}


def never_fits_quota(demand: dict[str, float], limits: dict[str, float]) -> str | None:
    """Why a job could never start under the quota (it alone asks for more), or None."""
    for resource, limit in limits.items():
        if demand.get(resource, 0.0) > limit + 1e-9:
            return (
                f"the job needs {demand[resource]:g} {resource} but each user's running jobs "
                f"may hold at most {limit:g} {resource} ({QUOTA_SETTINGS[resource]}); "
                "use fewer ranks or fewer resources per worker"
            )
    return None


class UserQuotas:
    """Checks a submit against the queued-jobs limit. Submits run concurrently (they must:
    idempotent submits race on the database's unique key), so a user's simultaneous
    submits may overshoot the limit by as many as are in flight at once."""

    def __init__(self, db: Database, settings: Settings) -> None:
        self.db = db
        self.max_queued = settings.user_max_queued_jobs

    def queued_jobs(self, user: Viewer) -> int:
        with self.db.session() as s:
            count = s.scalar(
                select(func.count())
                .select_from(Job)
                .where(Job.owner_id == user.id, Job.state == JobState.QUEUED.value)
            )
        return int(count or 0)

    def submit(self, user: Viewer, idempotency_key: str | None, create: Callable[[], T]) -> T:
        """Run `create` (which inserts the job) if the user may queue one more job. A
        replay of a submit already stored (same Idempotency-Key) is never refused."""
        if self.max_queued <= 0:
            return create()
        queued = self.queued_jobs(user)
        if queued >= self.max_queued and not self._replay(user, idempotency_key):
            raise QuotaExceeded(
                f"{user.name} has {queued} queued jobs, the most a user may have "
                f"(SHARDLINE_USER_MAX_QUEUED_JOBS={self.max_queued}); wait until some "
                "start or cancel some"
            )
        return create()

    def _replay(self, user: Viewer, idempotency_key: str | None) -> bool:
        if idempotency_key is None:
            return False
        with self.db.session() as s:
            found = s.scalar(
                select(Job.id).where(
                    Job.owner_id == user.id, Job.idempotency_key == idempotency_key
                )
            )
        return found is not None
