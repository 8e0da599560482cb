"""Admitting QUEUED jobs to the cluster: by priority, then age, when their bundles fit.

Policy (also in the README): jobs are considered in (priority desc, created asc) order.
A job that does not fit now does not block smaller jobs behind it (backfill), so a big job
at the head cannot hold the cluster idle. To keep backfill from starving that big job, once
the head has waited `reserve_after_s`, nothing behind it is admitted until it starts.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from shardline.service.loop import PeriodicLoop
from shardline.service.models import Job
from shardline.service.quotas import QUOTA_SETTINGS
from shardline.service.store import ConcurrentUpdate, IllegalTransition, JobStore, StoreError
from shardline.workers.contract.demand import (
    RESOURCE_NAMES,
    TRAINING_BYTES_PER_PARAM,
    admission_demand,
    counted,
    describe,
    job_demand,
    short_of,
    stored_demand,
)
from shardline.workers.contract.lifecycle import SUPERVISED, JobState
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)

# Host memory a whole CPU job may plan to hold; far above what CPU training is useful for.
MAX_CPU_JOB_BYTES = 64 << 30


def host_memory_refusal(spec: JobSpec, cluster_gpus: float | None = None) -> str | None:
    """Why a job on CPU ranks is too large to train in host memory, or None.

    Sharding spreads the state over ranks but does not shrink it, so the whole job counts.
    `cluster_gpus` (None: unknown) only picks the advice."""
    if spec.resources.gpus_per_worker > 0:
        return None
    params = spec.model.parameter_count()
    need = params * TRAINING_BYTES_PER_PARAM
    if need <= MAX_CPU_JOB_BYTES:
        return None
    advice = (
        "the cluster has no GPUs, so train a smaller model"
        if cluster_gpus == 0
        else "set resources.gpus_per_worker to train it on GPUs, or train a smaller model"
    )
    return (
        f"the model (model.preset={spec.model.preset!r} with any overrides) has "
        f"{params / 1e9:.1f}B parameters: about "
        f"{need / 2**30:.0f} GiB of fp32 weights, gradients and optimizer state, more than "
        f"the {MAX_CPU_JOB_BYTES >> 30} GiB a job on CPU ranks may hold; {advice}"
    )


@dataclass(frozen=True)
class Queued:
    job_id: str
    demand: dict[str, float]
    waited_s: float
    owner: str = ""


@dataclass(frozen=True)
class UserQuota:
    """What one user's started jobs may hold (resource -> limit; absent: no limit), and
    what each user's started jobs hold now."""

    limits: dict[str, float]
    held: dict[str, dict[str, float]]

    def refusal(self, job: Queued, held: dict[str, float]) -> str | None:
        for k, limit in self.limits.items():
            if held.get(k, 0.0) + job.demand.get(k, 0.0) > limit + 1e-9:
                return (
                    f"waiting for the user quota: {job.owner}'s running jobs hold "
                    f"{held.get(k, 0.0):g} of the {limit:g} {k} a user may hold "
                    f"({QUOTA_SETTINGS[k]}); this job needs {job.demand.get(k, 0.0):g} {k}"
                )
        return None


@dataclass(frozen=True)
class Plan:
    admit: list[str]
    waiting: dict[str, str]  # job id -> why it still waits


def plan_admissions(
    queue: list[Queued],
    free: dict[str, float],
    total: dict[str, float],
    reserve_after_s: float,
    quota: UserQuota | None = None,
) -> Plan:
    """Which of `queue` (already in priority, age order) to start now, and why not the rest.

    A job that would take its owner past `quota` waits and holds nobody back: it is not
    waiting for the cluster, so it never reserves it."""
    free = dict(free)
    held = {user: dict(r) for user, r in (quota.held if quota else {}).items()}
    admit: list[str] = []
    waiting: dict[str, str] = {}
    blocked_by: Queued | None = None
    for job in queue:
        over_quota = quota.refusal(job, held.get(job.owner, {})) if quota else None
        if over_quota is not None:
            waiting[job.job_id] = over_quota
            continue
        if blocked_by is not None:
            waiting[job.job_id] = (
                f"held behind job {blocked_by.job_id}, which has waited "
                f"{blocked_by.waited_s:.0f}s for resources"
            )
            continue
        short = short_of(job.demand, free)
        if not short:
            admit.append(job.job_id)
            owner_held = held.setdefault(job.owner, {})
            for k in RESOURCE_NAMES:
                if counted(k, free):
                    free[k] = free.get(k, 0) - job.demand.get(k, 0)
                owner_held[k] = owner_held.get(k, 0.0) + job.demand.get(k, 0)
            continue
        mem = "memory" in short
        waiting[job.job_id] = (
            f"waiting for resources: needs {describe(job.demand, memory=mem)}; "
            f"{describe(free, memory=mem)} free of {describe(total, memory=mem)}"
        )
        if job.waited_s >= reserve_after_s:
            blocked_by = job
    return Plan(admit, waiting)


class Scheduler(PeriodicLoop):
    """A loop in the control plane: plan, then start each admitted job's supervisor."""

    name = "scheduler"

    def __init__(
        self,
        store: JobStore,
        *,
        cluster_total: Callable[[], dict[str, float]],
        launch: Callable[[Job], None],
        discard: Callable[[str], None],
        interval_s: float = 1.0,
        reserve_after_s: float = 300.0,
        quota_limits: dict[str, float] | None = None,
    ) -> None:
        self.store = store
        self.quota_limits = quota_limits or {}
        self.cluster_total = cluster_total
        self.launch = launch
        self.discard = discard
        super().__init__(interval_s)
        self.reserve_after_s = reserve_after_s

    def tick(self) -> None:
        active = self.store.active_jobs()
        queued = sorted((j for j in active if j.state == JobState.QUEUED), key=admission_key)
        if not queued:
            return
        total = self.cluster_total()
        demand: dict[str, dict[str, float]] = {}
        # A queued elastic job needs only its fewest ranks free; a started one is counted
        # at its full size, whatever layout it runs now (the scheduler cannot see that).
        admitting: dict[str, dict[str, float]] = {}
        for j in active:
            try:
                spec = JobSpec.model_validate(j.spec)
                demand[j.id] = job_demand(spec)
                admitting[j.id] = admission_demand(spec)
            except Exception as err:  # one unreadable spec must not stop every other job
                if j.state == JobState.QUEUED:
                    self._fail(j, f"its stored spec cannot be read: {err}")
                else:
                    # Started under older rules: it runs on, and still holds its resources.
                    log.warning("job %s: stored spec no longer validates: %s", j.id, err)
                    demand[j.id] = stored_demand(j.spec)
        queued = [j for j in queued if j.id in demand]
        used = {k: 0.0 for k in RESOURCE_NAMES}
        held: dict[str, dict[str, float]] = {}
        # Only a job with a supervisor holds resources: a queued or paused one holds none.
        for j in active:
            if j.state not in SUPERVISED:
                continue
            owner_held = held.setdefault(j.owner.name, {})
            for k, v in demand[j.id].items():
                used[k] += v
                owner_held[k] = owner_held.get(k, 0.0) + v
        free = {k: total.get(k, 0) - used[k] for k in RESOURCE_NAMES if counted(k, total)}
        now = datetime.now(UTC)
        plan = plan_admissions(
            [
                Queued(
                    j.id, admitting[j.id], (now - _utc(j.created_at)).total_seconds(), j.owner.name
                )
                for j in queued
            ],
            free,
            total,
            self.reserve_after_s,
            UserQuota(self.quota_limits, held) if self.quota_limits else None,
        )
        by_id = {j.id: j for j in queued}
        for job_id in plan.admit:
            self._admit(by_id[job_id])
        for job_id, reason in plan.waiting.items():
            if by_id[job_id].queue_reason != reason:
                self.store.set_queue_reason(job_id, reason)

    def _admit(self, job: Job) -> None:
        try:
            self.launch(job)  # idempotent: reuses a supervisor that already exists
        except Exception as err:
            # Whatever this job's launch raises, it fails this job only, never the loop.
            log.exception("job %s could not be started", job.id)
            self._fail(job, f"could not be started: {type(err).__name__}: {err}")
            try:
                self.discard(job.id)  # a supervisor half-made by the failed launch
            except Exception:
                log.exception("job %s: removing its supervisor failed", job.id)
            return
        try:
            self.store.transition(
                job.id,
                JobState.STARTING,
                "admitted by the scheduler",
                expected_version=job.version,
                queue_reason=None,
            )
        except (ConcurrentUpdate, IllegalTransition) as err:
            # Cancelled meanwhile: nothing will read this supervisor, so remove it now.
            log.info("job %s not started: %s", job.id, err)
            self.discard(job.id)

    def _fail(self, job: Job, reason: str) -> None:
        reason = reason[:2000]  # an exception's text can be arbitrarily long
        try:
            self.store.transition(
                job.id, JobState.FAILED, reason, expected_version=job.version, failure_reason=reason
            )
        except StoreError as err:
            log.info("job %s not failed: %s", job.id, err)


class Ordered(Protocol):
    priority: int
    created_at: datetime


def admission_key(job: Ordered) -> tuple[int, datetime]:
    """The order queued jobs are considered in: higher priority first, then older first."""
    return -job.priority, _utc(job.created_at)


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
