"""Per-user resource quotas in admission planning (a pure function) and at submit."""

from __future__ import annotations

from pathlib import Path

from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.models import User
from shardline.service.quotas import never_fits_quota
from shardline.service.scheduler import Queued, Scheduler, UserQuota, plan_admissions
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec

TOTAL = {"CPU": 16.0, "GPU": 0.0}


def q(job_id: str, owner: str, cpus: float, waited: float = 0.0) -> Queued:
    return Queued(job_id, {"CPU": cpus, "GPU": 0.0}, waited, owner)


def test_a_job_past_its_owners_quota_waits_naming_the_quota() -> None:
    quota = UserQuota({"CPU": 8.0}, {"alice": {"CPU": 6.0}})
    plan = plan_admissions(
        [q("a1", "alice", 4), q("b1", "bob", 4)], {"CPU": 10.0}, TOTAL, 300, quota
    )
    assert plan.admit == ["b1"]
    assert plan.waiting["a1"] == (
        "waiting for the user quota: alice's running jobs hold 6 of the 8 CPU a user may hold "
        "(SHARDLINE_USER_MAX_CPUS); this job needs 4 CPU"
    )


def test_jobs_admitted_in_one_plan_count_against_the_quota() -> None:
    quota = UserQuota({"CPU": 8.0}, {})
    queue = [q("a1", "alice", 4), q("a2", "alice", 4), q("a3", "alice", 4), q("b1", "bob", 4)]
    plan = plan_admissions(queue, {"CPU": 16.0}, TOTAL, 300, quota)
    assert plan.admit == ["a1", "a2", "b1"]
    assert "alice's running jobs hold 8 of the 8 CPU" in plan.waiting["a3"]


def test_a_job_over_quota_never_reserves_the_cluster() -> None:
    # alice's job has waited long, but for her quota, not for the cluster: bob backfills.
    quota = UserQuota({"CPU": 4.0}, {"alice": {"CPU": 4.0}})
    queue = [q("a1", "alice", 4, waited=1000), q("b1", "bob", 2)]
    plan = plan_admissions(queue, {"CPU": 12.0}, TOTAL, 300, quota)
    assert plan.admit == ["b1"]
    assert plan.waiting["a1"].startswith("waiting for the user quota")


def test_without_a_quota_nothing_changes() -> None:
    plan = plan_admissions([q("a1", "alice", 8), q("a2", "alice", 8)], {"CPU": 16.0}, TOTAL, 300)
    assert plan.admit == ["a1", "a2"]


def test_a_job_larger_than_the_quota_is_refused_at_submit() -> None:
    reason = never_fits_quota({"CPU": 12.0, "GPU": 0.0}, {"CPU": 8.0})
    assert reason is not None and "SHARDLINE_USER_MAX_CPUS" in reason and "needs 12 CPU" in reason
    assert never_fits_quota({"CPU": 8.0, "GPU": 0.0}, {"CPU": 8.0}) is None
    assert never_fits_quota({"CPU": 8.0, "GPU": 2.0}, {}) is None


def test_the_scheduler_holds_a_users_job_past_the_quota(tmp_path: Path) -> None:
    """Over a real store: alice's running job counts against her quota, bob's does not,
    and a PAUSED job of hers holds nothing."""
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade_to_head(url)
    db = Database(url)
    store, users = JobStore(db), UserDirectory(db)
    alice, bob = users.ensure_user("alice"), users.ensure_user("bob")

    def submit(owner: User, name: str, cpus: float) -> str:
        spec = {"name": name, "resources": {"cpus_per_worker": cpus}}
        return store.create(owner, JobSpec.model_validate(spec))[0].id

    launched: list[str] = []
    loop = Scheduler(
        store,
        cluster_total=lambda: {"CPU": 16.0, "GPU": 0.0},
        launch=lambda job: launched.append(job.id),
        discard=lambda _: None,
        quota_limits={"CPU": 4.0},
    )
    running = submit(alice, "a-running", 3)
    loop.tick()
    assert launched == [running]
    second, other = submit(alice, "a-second", 2), submit(bob, "b-first", 2)
    loop.tick()
    assert launched == [running, other]
    reason = store.get(second).queue_reason or ""
    assert "alice's running jobs hold 3 of the 4 CPU" in reason, reason
    # Once her running job is paused it holds nothing, and her second job starts.
    for to in (JobState.RUNNING, JobState.PAUSING, JobState.PAUSED):
        store.transition(running, to, "test")
    loop.tick()
    assert launched == [running, other, second]
    db.dispose()
