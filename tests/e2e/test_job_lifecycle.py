"""A job submitted over REST trains on Ray and its progress lands in the database."""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import pytest
from sqlalchemy import func, select

from api.client import Client, InvalidRequest
from service.db import Database
from service.models import JobMetric
from service.store import JobStore
from tests.e2e.conftest import Service, leftovers
from workers.engine.launch import train_local
from workers.spec import JobSpec

ServiceFactory = Callable[..., AbstractContextManager[Service]]


def spec(name: str, **train: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"preset": "tiny", "seq_len": 32},
        "parallel": {"dp": 2, "zero_stage": 1},
        "train": {
            "steps": 8,
            "global_batch_size": 4,
            "micro_batch_size": 1,
            "lr": 3e-3,
            "log_every": 1,
            "seed": 3,
            **train,
        },
    }


def wait_for(
    client: Client, job_id: str, predicate: Callable[[dict[str, Any]], bool], timeout: float
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = client.get(job_id)
        if predicate(job):
            return job
        assert time.monotonic() < deadline, f"timed out; job is {job['state']}: {job}"
        time.sleep(0.3)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
def test_submitted_job_trains_to_success_like_shardline_train(
    service: ServiceFactory, database: str
) -> None:
    body = spec("e2e-success")
    reference = train_local(JobSpec.model_validate(body), 2)
    with service(database) as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        done = c.wait(job["id"], timeout=240, poll_s=0.5)
        assert done["state"] == "SUCCEEDED", done
        metrics = c.metrics(job["id"])
        assert [m["step"] for m in metrics] == list(range(1, 9))
        assert metrics[-1]["loss"] == pytest.approx(reference["final_loss"], rel=1e-5)
        assert done["step"] == 8 and done["latest_metrics"]["step"] == 8
        db = Database(svc.database_url)
        with db.session() as s:
            rows = s.scalar(
                select(func.count()).select_from(JobMetric).where(JobMetric.job_id == job["id"])
            )
        db.dispose()
        assert rows == 8  # one row per logged step, no duplicates
        moves = [
            (e["data"]["from"], e["data"]["to"])
            for e in c.events(job["id"])
            if e["kind"] == "state"
        ]
        assert moves == [("QUEUED", "STARTING"), ("STARTING", "RUNNING"), ("RUNNING", "SUCCEEDED")]
        assert any("step 8 loss" in line for line in c.logs(job["id"], rank=1))
        wait_for(
            c, job["id"], lambda j: not leftovers(svc.ray_address, j["id"])["actors"], timeout=30
        )
        assert leftovers(svc.ray_address, job["id"]) == {"actors": [], "placement_groups": []}


def test_a_job_that_can_never_fit_is_refused_at_submit(service: ServiceFactory) -> None:
    too_big = spec("too-big")
    too_big["resources"] = {"cpus_per_worker": 6}
    with service() as svc, svc.running() as server, svc.client(server) as c:
        with pytest.raises(InvalidRequest) as err:
            c.submit(too_big)
        assert err.value.code == "does_not_fit"
        assert "needs 12 CPU" in err.value.message and "has 8 CPU" in err.value.message


def test_second_job_waits_queued_with_a_reason_then_runs(service: ServiceFactory) -> None:
    first, second = spec("big-first", steps=30), spec("waits-second")
    first["resources"] = {"cpus_per_worker": 3}  # 6 of 8 CPUs
    second["resources"] = {"cpus_per_worker": 2}  # needs 4: only 2 left
    with service() as svc, svc.running() as server, svc.client(server) as c:
        a = c.submit(first)
        wait_for(c, a["id"], lambda j: j["state"] == "RUNNING", timeout=120)
        b = c.submit(second)
        waiting = wait_for(c, b["id"], lambda j: j["queue_reason"] is not None, timeout=30)
        assert waiting["state"] == "QUEUED"
        assert "needs 4 CPU; 2 CPU free of 8 CPU" in waiting["queue_reason"]
        assert c.wait(a["id"], timeout=240, poll_s=0.5)["state"] == "SUCCEEDED"
        done = c.wait(b["id"], timeout=240, poll_s=0.5)
        assert done["state"] == "SUCCEEDED" and done["queue_reason"] is None
        assert c.get(b["id"])["started_at"] >= c.get(a["id"])["finished_at"]


def test_cancelling_a_running_job_ends_it_and_frees_ray(service: ServiceFactory) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(spec("to-cancel", steps=100_000, log_every=5))
        wait_for(c, job["id"], lambda j: j["step"] >= 5, timeout=120)
        started = time.monotonic()
        assert c.cancel(job["id"])["state"] == "CANCELLING"
        done = wait_for(c, job["id"], lambda j: j["state"] == "CANCELLED", timeout=15)
        assert time.monotonic() - started < 15
        assert done["finished_at"] is not None
        wait_for(
            c,
            job["id"],
            lambda j: leftovers(svc.ray_address, j["id"]) == {"actors": [], "placement_groups": []},
            timeout=10,
        )


def test_restarting_the_control_plane_loses_nothing(service: ServiceFactory) -> None:
    with service() as svc:
        with svc.running() as server, svc.client(server) as c:
            job = c.submit(spec("survives-restart", steps=40))
            wait_for(c, job["id"], lambda j: j["step"] >= 3, timeout=120)
        # The control plane is down; the detached supervisor keeps training.
        db = Database(svc.database_url)
        at_stop = JobStore(db).get(job["id"])
        db.dispose()
        assert at_stop.state == "RUNNING" and at_stop.current_step < 40
        time.sleep(3)
        with svc.running() as server, svc.client(server) as c:
            done = c.wait(job["id"], timeout=240, poll_s=0.5)
            assert done["state"] == "SUCCEEDED"
            steps = [m["step"] for m in c.metrics(job["id"])]
            assert steps == list(range(1, 41))  # none missing, none twice
            assert leftovers(svc.ray_address, job["id"])["placement_groups"] == []
