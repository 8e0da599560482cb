"""Faults injected through the API (admins only) on a real local Ray cluster: each kind
recovers to SUCCEEDED with every step's metrics recorded exactly once, and the job shows
what the recovery cost. A non-finite loss rolls back and skips its batch, and the run
then equals one process trained on the data with that batch taken out."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import Any

import pytest

from shardline.api.client import Client, Forbidden
from shardline.service.db import Database
from shardline.service.users import UserDirectory
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.data.loader import Batch
from shardline.workers.engine.launch import train_local
from shardline.workers.engine.trainer import Trainer
from tests.dist.ranks import on_ranks
from tests.e2e.conftest import Service, resumed, wait_for
from tests.support.server import RunningServer

ServiceFactory = Callable[..., AbstractContextManager[Service]]
STEPS = 24
CHECKPOINT_EVERY = 2
LIMIT_S = 300.0  # generous: a loaded 2-core machine is slow

BODY: dict[str, Any] = {
    "name": "e2e-faults",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2, "zero_stage": 2},
    "train": {
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 3e-3,
        "log_every": 1,
        "seed": 13,
    },
    # Storage checkpoints are what these tests restore from: no in-memory snapshots.
    "checkpoint": {"every_steps": CHECKPOINT_EVERY, "memory_every_steps": 0},
    "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 8, "max_nonfinite_skips": 1},
}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(BODY), 2, on_metrics=metrics.append)
    return metrics


def admin_client(svc: Service, server: RunningServer) -> Client:
    db = Database(svc.database_url)
    users = UserDirectory(db)
    admin = users.ensure_user(f"admin-{uuid.uuid4().hex[:6]}", admin=True)
    token = users.issue_token(admin, "chaos").token
    db.dispose()
    return Client(server.url, token)


def finished(c: Client, job_id: str) -> dict[str, Any]:
    return wait_for(
        c, job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), LIMIT_S
    )


def faulted_to_success(
    c: Client, admin: Client, body: dict[str, Any], kind: str, after_step: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Submit `body`, `kind` on rank 1 once it has trained `after_step` steps; the job, and
    the job once it SUCCEEDED."""
    job = c.submit(body)
    wait_for(c, job["id"], lambda j: j["state"] == "RUNNING" and j["step"] >= after_step, LIMIT_S)
    admin.inject_fault(job["id"], kind, 1)
    done = finished(c, job["id"])
    assert done["state"] == "SUCCEEDED", messages(c, job["id"])
    return job, done


def events_of(c: Client, job_id: str) -> list[dict[str, Any]]:
    return c.events(job_id, after=0)


def messages(c: Client, job_id: str) -> str:
    return "\n".join(e["message"] for e in events_of(c, job_id))


def assert_each_step_once_like(c: Client, job_id: str, reference: list[dict[str, Any]]) -> None:
    metrics = c.metrics(job_id)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), f"step {got['step']}"


# A kill is what tests/e2e/test_recovery.py does from outside the rank; the kinds here are
# the failures only a rank itself can show: no progress while it still answers, and an error.
@pytest.mark.parametrize(("kind", "database"), [("hang", "sqlite"), ("raise", "postgresql")])
def test_each_fault_kind_recovers_with_every_step_once(
    service: ServiceFactory, reference: list[dict[str, Any]], kind: str, database: str
) -> None:
    with service(database) as svc, svc.running() as server, svc.client(server) as c:
        admin = admin_client(svc, server)
        job = c.submit(BODY)
        wait_for(c, job["id"], lambda j: j["state"] == "RUNNING" and j["step"] >= 5, LIMIT_S)
        with pytest.raises(Forbidden):
            c.inject_fault(job["id"], kind, 1)  # the job's own user is no admin
        delivered = admin.inject_fault(job["id"], kind, 1)
        assert delivered["message"] == f"{kind} delivered to rank 1"
        done = finished(c, job["id"])
        assert done["state"] == "SUCCEEDED", messages(c, job["id"])
        assert done["restarts"] == 1, messages(c, job["id"])
        assert_each_step_once_like(c, job["id"], reference)
        resumed(c, job["id"], tier="storage", after_at_least=4, lost_at_most=CHECKPOINT_EVERY)
        events = events_of(c, job["id"])
        admin.close()
    recoveries = [e["data"] for e in events if (e["data"] or {}).get("kind") == "recovery"]
    assert len(recoveries) == 1, messages(c, job["id"])
    rec = recoveries[0]
    assert rec["injected"] == f"{kind} on rank 1"
    assert 1 in rec["ranks"] and len(rec["nodes"]) == 1
    assert rec["restored_step"] >= 4 and rec["mttr_s"] > 0
    # In place: rank 1 replaced (a raise too: rank 0 waits in its collective until rank
    # 1's process is gone), rank 0 kept its process.
    assert (rec["in_place"], rec["replaced"]) == (True, [1]), rec
    if kind == "hang":
        assert rec["ranks"] == [1] and rec["rank_steps"]["1"] < rec["rank_steps"]["0"]
        assert rec["mttr_s"] >= 8  # counted from when rank 1 stopped, not when noticed
    # What GET shows adds up the recovery events.
    assert done["steps_lost"] == rec["steps_lost"]
    assert done["seconds_lost"] == pytest.approx(rec["seconds_lost"])
    assert done["seconds_lost"] >= rec["mttr_s"] > 0
    assert 0 < done["goodput"] < 1


def test_a_nonfinite_loss_rolls_back_skips_its_batch_and_succeeds(
    service: ServiceFactory, reference: list[dict[str, Any]]
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        admin = admin_client(svc, server)
        job, done = faulted_to_success(c, admin, BODY, "nan", after_step=5)
        restore = resumed(c, job["id"], tier="storage", after_at_least=4, lost_at_most=None)
        metrics = c.metrics(job["id"])
        events = events_of(c, job["id"])
        admin.close()
        skips = svc.settings.job_layout(job["id"]).skipped_batches().read()
    said = [e for e in events if e["message"].startswith("non-finite loss")]
    assert len(said) == 1, messages(c, job["id"])
    step = said[0]["data"]["step"]
    assert said[0]["data"] == {"step": step, "batch": step, "skipped": True, "kind": "nonfinite"}
    assert f"the loss of step {step} is not finite" in said[0]["message"]
    assert skips == [{"step": step, "batch": step}]
    rec = next(e["data"] for e in events if (e["data"] or {}).get("kind") == "recovery")
    assert rec["skipped"] == {"step": step, "batch": step}
    assert rec["restored_step"] == restore["step"] < step
    assert (rec["in_place"], rec["replaced"]) == (True, []), rec  # every rank kept its process
    # A rollback restarts the workers but spends none of the failure budget.
    assert (done["restarts"], done["failures"]) == (1, 0)
    assert done["steps_lost"] == rec["steps_lost"]
    # Every step once: up to the skip as the plain run, and all of them exactly as a run
    # that skips the same batch from the start (resume stays exact).
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics[: step - 1], reference, strict=False):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), f"step {got['step']}"
    # The reference knows nothing of faults: one process, no skip record, the batch
    # simply taken out of the data beforehand (every later step trains the next one).
    (expected,) = on_ranks(partial(_batch_removed, skip=step), 1)
    assert len(expected) == STEPS
    for got, want in zip(metrics, expected, strict=True):
        assert got["loss"] == pytest.approx(want, rel=1e-4), f"step {got['step']}"
    assert metrics[step - 1]["loss"] != pytest.approx(reference[step - 1]["loss"], rel=1e-4)


def _batch_removed(rank: int, world: int, device: Any, *, skip: int) -> list[float]:
    """BODY's losses in one process with batch `skip` removed from the data: a plain
    Trainer whose loader is asked for the batch after where the removed one was."""
    spec = JobSpec.model_validate(
        {**BODY, "parallel": {}, "checkpoint": {"every_steps": 0, "memory_every_steps": 0}}
    )
    trainer = Trainer(spec, world_size=world, device=device)
    batch_of = trainer.loader.train_batch

    def removed(step: int) -> Batch:
        return batch_of(step + 1 if step >= skip else step)

    trainer.loader.train_batch = removed  # type: ignore[method-assign]
    return [float(trainer.train_step()["loss"]) for _ in range(STEPS)]


# Local SGD (DiLoCo): the replicas agree only every 4 steps, and snapshot there.
LOCAL_SGD: dict[str, Any] = {
    **BODY,
    "name": "e2e-faults-local-sgd",
    "parallel": {"dp": 2, "dp_mode": "local_sgd", "local_sgd": {"sync_every": 4}},
    "checkpoint": {"every_steps": 0, "memory_every_steps": 4},
}


def test_a_killed_local_sgd_replica_resumes_from_the_last_sync_with_every_step_once(
    service: ServiceFactory,
) -> None:
    reference: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(LOCAL_SGD), 2, on_metrics=reference.append)
    with service() as svc, svc.running() as server, svc.client(server) as c:
        admin = admin_client(svc, server)
        job, _ = faulted_to_success(c, admin, LOCAL_SGD, "kill", after_step=6)
        # From the snapshot of a sync: each replica's own optimizer state and the outer
        # momentum come back, so every step after it is the uninterrupted run's.
        restore = resumed(c, job["id"], tier="memory", after_at_least=4, lost_at_most=4)
        assert restore["step"] % 4 == 0
        assert_each_step_once_like(c, job["id"], reference)
        assert c.metrics(job["id"])[-1]["outer_steps"] == STEPS // 4
        admin.close()


# Async replicas: each rank serves a shard of the parameters and meets the others every
# 4 steps, where the snapshots are.
ASYNC: dict[str, Any] = {
    **BODY,
    "name": "e2e-faults-async",
    "parallel": {"dp": 2, "dp_mode": "async"},
    "train": {**BODY["train"], "log_every": 4},
    "checkpoint": {"every_steps": 0, "memory_every_steps": 4},
}


def test_a_killed_parameter_server_and_its_replica_resume_from_the_last_meeting(
    service: ServiceFactory,
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        admin = admin_client(svc, server)
        # Rank 1 is the actor that serves shard 1 of the parameters (and trains beside it).
        job, done = faulted_to_success(c, admin, ASYNC, "kill", after_step=6)
        assert done["restarts"] == 1, messages(c, job["id"])
        restore = resumed(c, job["id"], tier="memory", after_at_least=4, lost_at_most=4)
        assert restore["step"] % 4 == 0
        metrics = c.metrics(job["id"])
        # Every meeting logged once, each with all of its steps' batches pushed.
        assert [m["step"] for m in metrics] == [1, *range(4, STEPS + 1, 4)]
        assert [m["pushes"] for m in metrics] == [2, 6, *[8] * (STEPS // 4 - 1)]
        assert metrics[-1]["loss"] < metrics[0]["loss"]
        admin.close()
