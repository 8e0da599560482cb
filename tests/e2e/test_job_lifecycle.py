"""A job submitted over REST trains on Ray and its progress lands in the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
import ray
from sqlalchemy import func, select

from shardline.api.client import InvalidRequest
from shardline.service.db import Database
from shardline.service.local_ray import LocalRay, host_cores
from shardline.service.models import JobMetric
from shardline.service.store import JobStore
from shardline.workers.contract.progress import MetricsEntry, ProgressEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from shardline.workers.runtime.joining import wait_for_start
from shardline.workers.runtime.names import NAMESPACE, supervisor_name
from shardline.workers.runtime.supervisor.workers import StartCancelled
from tests.e2e.conftest import Service, job_spec, leftovers, state_moves, wait_for

ServiceFactory = Callable[..., AbstractContextManager[Service]]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


def supervisor_step_after(address: str, job_id: str, step: int, timeout: float = 300) -> int:
    """The newest step the job's supervisor has buffered, once it is past `step`."""
    leftovers(address, job_id)  # connects this process to Ray
    supervisor = ray.get_actor(supervisor_name(job_id), namespace=NAMESPACE)
    deadline = time.monotonic() + timeout
    while True:
        progress: Any = ray.get(supervisor.read.remote(0), timeout=60)
        entries: list[ProgressEntry] = progress["entries"]
        newest = max((e.step for e in entries if isinstance(e, MetricsEntry)), default=0)
        if newest > step or time.monotonic() > deadline:
            return newest
        time.sleep(0.5)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_submitted_job_trains_to_success_like_shardline_train(
    service: ServiceFactory, database: str
) -> None:
    body = job_spec("e2e-success")
    # What `shardline train` does with the same spec on two local processes.
    reference: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(body), 2, on_metrics=reference.append)
    with service(database) as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        done = c.wait(job["id"], timeout=240, poll_s=0.5)
        assert done["state"] == "SUCCEEDED", done
        metrics = c.metrics(job["id"])
        assert [m["step"] for m in metrics] == list(range(1, 9))
        # Same data, same layout: every step, not just the last, matches the local run.
        for ref, got in zip(reference, metrics, strict=True):
            assert (got["step"], got["lr"]) == (ref["step"], ref["lr"])
            assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), got["step"]
            assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4), got["step"]
            # Where each rank's step went reaches the API, one row per rank.
            assert [row["rank"] for row in got["breakdown"]] == [0, 1], got["step"]
            assert all(row["compute_s"] > 0 for row in got["breakdown"])
        assert metrics[-1]["loss"] < metrics[0]["loss"]
        assert done["step"] == 8 and done["latest_metrics"]["step"] == 8
        db = Database(svc.database_url)
        with db.session() as s:
            rows = s.scalar(
                select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job["id"])
            )
        db.dispose()
        assert rows == 8  # one row per logged step, no duplicates
        moves = state_moves(c, job["id"])
        assert moves == [("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "SUCCEEDED")]
        # Submit -> first step, once, timed by the step's own end.
        firsts = [e for e in c.events(job["id"]) if e["data"].get("kind") == "first_step"]
        assert len(firsts) == 1 and 0 < firsts[0]["data"]["seconds"] < 120, firsts
        assert firsts[0]["data"]["step"] == 1
        assert firsts[0]["message"].startswith("first step ")
        assert any("step 8 loss" in line for line in c.logs(job["id"], rank=1))
        wait_for(
            c, job["id"], lambda j: not leftovers(svc.ray_address, j["id"])["actors"], timeout=120
        )
        assert leftovers(svc.ray_address, job["id"]) == {"actors": [], "placement_groups": []}


def test_a_job_that_can_never_fit_is_refused_at_submit(service: ServiceFactory) -> None:
    too_big = job_spec("too-big")
    too_big["resources"] = {"cpus_per_worker": 6}
    with service() as svc, svc.running() as server, svc.client(server) as c:
        with pytest.raises(InvalidRequest) as err:
            c.submit(too_big)
        assert err.value.code == "does_not_fit"
        assert "needs 12 CPU" in err.value.message and "has 8 CPU" in err.value.message


def test_crowding_jobs_are_refused_and_plans_and_auto_use_what_is_admitted(
    service: ServiceFactory,
) -> None:
    """The embedded head declares 8 logical CPUs whatever the host has, and labels its real
    cores: 8 ranks fit the CPUs, and are refused where each would get less of a core than
    the server's minimum (set here to twice what 8 ranks get on this host)."""
    cores = host_cores()
    crowded = job_spec("crowded")
    crowded["parallel"] = {"dp": 8}
    crowded["train"] = {**crowded["train"], "global_batch_size": 8}
    with service() as svc:
        svc.settings = svc.settings.model_copy(update={"min_core_share": 2 * cores / 8})
        with svc.running() as server, svc.client(server) as c:
            with pytest.raises(InvalidRequest) as err:
                c.submit(crowded)
            assert err.value.code == "does_not_fit"
            assert f"the job's 8 ranks would share the cluster's {cores} CPU cores" in (
                err.value.message
            )
            assert "use at most 4 ranks" in err.value.message
            # Planned on what the cluster has free now: 8 CPUs, but only 4 ranks admitted.
            plan = c.plan(job_spec("planned"))
            assert plan["ranks"] == 4 and plan["device"] == "cpu"
            assert all(
                item["parallel"]["dp"] * item["parallel"]["tp"] * item["parallel"]["pp"] == 4
                for item in plan["layouts"]
            )
            # parallel: auto takes the fastest predicted layout on what is free and admitted,
            # says so in its events, and trains in it.
            auto = {**job_spec("auto"), "parallel": {"auto": True, "max_pp": 1}}
            job = c.submit(auto, idempotency_key="auto-1")
            assert c.submit(auto, idempotency_key="auto-1")["id"] == job["id"]  # a replay
            done = c.wait(job["id"], timeout=180, poll_s=0.5)
            assert done["state"] == "SUCCEEDED", done
            planned = [e for e in c.events(job["id"]) if e["data"].get("kind") == "planned"]
            assert len(planned) == 1 and planned[0]["message"].startswith("layout chosen: dp=")
            chosen = planned[0]["data"]["parallel"]
            assert chosen["pp"] == 1 and chosen["dp"] * chosen["tp"] <= 4 and not chosen["auto"]
            assert [m["step"] for m in c.metrics(job["id"])] == list(range(1, 9))


def test_second_job_waits_queued_with_a_reason_then_runs(service: ServiceFactory) -> None:
    first, second = job_spec("big-first", steps=30), job_spec("waits-second")
    first["resources"] = {"cpus_per_worker": 3}  # 6 of 8 CPUs
    second["resources"] = {"cpus_per_worker": 2}  # needs 4: only 2 left
    with service() as svc, svc.running() as server, svc.client(server) as c:
        a = c.submit(first)
        wait_for(c, a["id"], lambda j: j["state"] == "RUNNING", timeout=120)
        b = c.submit(second)
        waiting = wait_for(c, b["id"], lambda j: j["queue_reason"] is not None, timeout=120)
        assert waiting["state"] == "QUEUED"
        assert "needs 4 CPU; 2 CPU free of 8 CPU" in waiting["queue_reason"]
        assert c.wait(a["id"], timeout=240, poll_s=0.5)["state"] == "SUCCEEDED"
        done = c.wait(b["id"], timeout=240, poll_s=0.5)
        assert done["state"] == "SUCCEEDED" and done["queue_reason"] is None
        assert c.get(b["id"])["started_at"] >= c.get(a["id"])["finished_at"]


def test_cancelling_a_running_job_ends_it_and_frees_ray(service: ServiceFactory) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(job_spec("to-cancel", steps=100_000, log_every=5))
        wait_for(c, job["id"], lambda j: j["step"] >= 5, timeout=300)
        assert c.cancel(job["id"])["state"] == "CANCELLING"
        # Limits are generous for a loaded machine; what matters is what happened.
        done = wait_for(c, job["id"], lambda j: j["state"] in TERMINAL, timeout=300)
        assert done["state"] == "CANCELLED" and done["finished_at"] is not None
        assert done["step"] < 100_000  # it stopped early, not by training to the end
        moves = state_moves(c, job["id"])
        assert moves[-2:] == [("RUNNING", "CANCELLING"), ("CANCELLING", "CANCELLED")]
        wait_for(
            c,
            job["id"],
            lambda j: leftovers(svc.ray_address, j["id"]) == {"actors": [], "placement_groups": []},
            timeout=120,
        )


STEPS_ACROSS_RESTART = 120


def test_restarting_the_control_plane_loses_nothing(service: ServiceFactory) -> None:
    with service() as svc:
        with svc.running() as server, svc.client(server) as c:
            # Enough steps to outlast the stop on a loaded machine (40 once ended first).
            job = c.submit(job_spec("survives-restart", steps=STEPS_ACROSS_RESTART))
            wait_for(c, job["id"], lambda j: j["step"] >= 3, timeout=300)
        # The control plane is down; the detached supervisor keeps training.
        db = Database(svc.database_url)
        at_stop = JobStore(db).get(job["id"])
        assert at_stop.state == "RUNNING" and at_stop.current_step < STEPS_ACROSS_RESTART
        trained_on = supervisor_step_after(svc.ray_address, job["id"], at_stop.current_step)
        assert trained_on > at_stop.current_step
        # ... while nothing wrote to the database, which only the control plane does.
        assert JobStore(db).get(job["id"]).current_step == at_stop.current_step
        db.dispose()
        with svc.running() as server, svc.client(server) as c:
            done = c.wait(job["id"], timeout=240, poll_s=0.5)
            assert done["state"] == "SUCCEEDED"
            steps = [m["step"] for m in c.metrics(job["id"])]
            assert steps == list(range(1, STEPS_ACROSS_RESTART + 1))  # none missing, none twice
            assert leftovers(svc.ray_address, job["id"])["placement_groups"] == []


@ray.remote(num_cpus=0)
def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_a_start_that_waits_for_workers_gives_way_to_a_cancel(ray_cluster: LocalRay) -> None:
    """WorkerGroup.start waits for the world in slices: a cancel does not wait out the
    join timeout (minutes, where many ranks import torch on few cores)."""
    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, namespace="start-test", log_to_driver=False)
    slow = _sleep.remote(60)
    asked = time.monotonic() + 0.5
    started = time.monotonic()
    with pytest.raises(StartCancelled):
        wait_for_start([slow], time.monotonic() + 300, lambda: time.monotonic() > asked)
    assert time.monotonic() - started < 5
    ray.cancel(slow, force=True)


@ray.remote(num_cpus=0)
class _Rank:
    def start(self, seconds: float) -> None:
        time.sleep(seconds)


def test_a_start_with_a_dead_rank_fails_at_once(ray_cluster: LocalRay) -> None:
    """A rank whose actor died (with its node, say) fails the start now: the ranks still
    alive would wait for it in the rendezvous until their join timeout."""
    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, namespace="start-test", log_to_driver=False)
    alive, doomed = _Rank.remote(), _Rank.remote()  # type: ignore[attr-defined]
    waiting = alive.start.remote(60)
    dies = doomed.start.remote(60)
    time.sleep(0.5)
    ray.kill(doomed, no_restart=True)
    started = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError):
        wait_for_start([waiting, dies], time.monotonic() + 300, lambda: False)
    assert time.monotonic() - started < 10
    ray.kill(alive, no_restart=True)
