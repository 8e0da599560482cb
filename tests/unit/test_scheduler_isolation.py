"""One job the scheduler cannot read or launch fails alone; every other job still starts.

The scheduler runs over a real job store on a SQLite file; only the launcher is a stand-in.
"""

from __future__ import annotations

from sqlalchemy import update

from shardline.service.models import Job
from shardline.service.scheduler import Scheduler
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec


def submit(store: JobStore, name: str) -> str:
    owner = UserDirectory(store.db).ensure_user("alice")
    job, _ = store.create(owner, JobSpec.model_validate({"name": name}))
    return job.id


def scheduler(
    store: JobStore, launched: list[str], broken: frozenset[str] = frozenset()
) -> Scheduler:
    def launch(job: Job) -> None:
        if job.id in broken:
            raise RuntimeError("the cluster refused this job's actor")
        launched.append(job.id)

    return Scheduler(
        store,
        cluster_total=lambda: {"CPU": 8.0, "GPU": 0.0},
        launch=launch,
        discard=lambda _: None,
    )


def test_a_stored_spec_that_cannot_be_parsed_fails_that_job_only(store: JobStore) -> None:
    bad, good = submit(store, "bad"), submit(store, "good")
    # A row written before the spec refused infinities: SQLite keeps `Infinity` in the JSON.
    with store.db.session() as s:
        spec = {"name": "bad", "train": {"grad_clip": float("inf")}}
        s.execute(update(Job).where(Job.id == bad).values(spec=spec))
        s.commit()
    launched: list[str] = []
    scheduler(store, launched).tick()
    assert launched == [good]
    assert store.get(good).state == JobState.STARTING
    failed = store.get(bad)
    assert failed.state == JobState.FAILED
    assert "spec cannot be read" in (failed.failure_reason or "")
    assert "train.grad_clip" in (failed.failure_reason or "")


def test_a_job_whose_launch_raises_fails_alone_and_the_loop_goes_on(store: JobStore) -> None:
    first, second = submit(store, "first"), submit(store, "second")
    launched: list[str] = []
    loop = scheduler(store, launched, broken=frozenset({first}))
    loop.tick()  # must not raise
    assert launched == [second]
    assert store.get(second).state == JobState.STARTING
    failed = store.get(first)
    assert failed.state == JobState.FAILED
    assert "the cluster refused this job's actor" in (failed.failure_reason or "")
    third = submit(store, "third")
    loop.tick()
    assert launched == [second, third]


def test_a_started_job_whose_spec_no_longer_validates_keeps_running_and_its_cpus(
    store: JobStore,
) -> None:
    """Bounds tightened since it started (here: cpus_per_worker below today's minimum):
    the scheduler leaves it alone and still counts what it holds."""
    old, waiting = submit(store, "old"), submit(store, "waiting")
    store.transition(old, JobState.STARTING, "started before the upgrade")
    with store.db.session() as s:
        spec = {"name": "old", "parallel": {"dp": 8}, "resources": {"cpus_per_worker": 0.05}}
        s.execute(update(Job).where(Job.id == old).values(spec=spec))
        s.execute(
            update(Job)
            .where(Job.id == waiting)
            .values(spec={"name": "waiting", "resources": {"cpus_per_worker": 7.8}})
        )
        s.commit()
    launched: list[str] = []
    scheduler(store, launched).tick()
    assert store.get(old).state == JobState.STARTING
    assert launched == []  # 8 x 0.05 CPU held: 7.6 of 8 free, not enough for 7.8
    assert "needs 7.8 CPU; 7.6 CPU free" in (store.get(waiting).queue_reason or "")


# A job that takes the whole 8-CPU test cluster.
EIGHT_RANKS = {"parallel": {"dp": 8}, "train": {"global_batch_size": 16, "micro_batch_size": 2}}


def test_a_paused_job_holds_no_resources(store: JobStore) -> None:
    # A paused job has freed its workers and placement group: it must not keep a queued
    # job waiting for CPUs it no longer holds.
    paused = store.create(
        UserDirectory(store.db).ensure_user("alice"),
        JobSpec.model_validate({"name": "paused", **EIGHT_RANKS}),
    )[0].id
    with store.db.session() as s:
        s.execute(update(Job).where(Job.id == paused).values(state=JobState.PAUSED.value))
        s.commit()
    waiting = store.create(
        UserDirectory(store.db).ensure_user("alice"),
        JobSpec.model_validate({"name": "waiting", **EIGHT_RANKS}),
    )[0].id
    launched: list[str] = []
    scheduler(store, launched).tick()
    assert launched == [waiting]


def test_an_elastic_job_is_admitted_when_its_fewest_ranks_fit(store: JobStore) -> None:
    alice = UserDirectory(store.db).ensure_user("alice")
    running = store.create(
        alice,
        JobSpec.model_validate(
            {"name": "six", "parallel": {"dp": 6}, "train": {"global_batch_size": 12}}
        ),
    )
    with store.db.session() as s:
        s.execute(update(Job).where(Job.id == running[0].id).values(state="RUNNING"))
        s.commit()
    # 2 CPUs free: the fixed 8-rank job waits, the elastic one (at least 2 ranks) starts.
    fixed = store.create(alice, JobSpec.model_validate({"name": "fixed", **EIGHT_RANKS}))[0].id
    elastic = {**EIGHT_RANKS, "fault_tolerance": {"elastic": {"min_dp": 2}}}
    grows = store.create(alice, JobSpec.model_validate({"name": "grows", **elastic}))[0].id
    launched: list[str] = []
    scheduler(store, launched).tick()
    assert launched == [grows]
    assert "needs 8 CPU; 2 CPU free" in (store.get(fixed).queue_reason or "")
