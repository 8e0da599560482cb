"""Recovering from failures on a real local Ray cluster: a worker killed (restored from the
snapshot in host memory), a rank frozen, the supervisor killed (restored from storage); the
job continues with every step's loss equal to an uninterrupted run, each step recorded once,
and the broken process gone. And when not to retry.

Each test here is one mechanism end to end; what the supervisor decides in each case (which
ranks to replace, when to give up, how long to wait) is held case by case against scripted
workers in tests/unit/test_supervisor*.py."""

from __future__ import annotations

import os
import signal
import stat
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import ray

from shardline.api.client import Client
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from shardline.workers.runtime.names import NAMESPACE, supervisor_name, worker_name
from tests.e2e.conftest import (
    Service,
    holds_nothing_within,
    resumed,
    state_moves,
    wait_for,
    worker_pid,
)

ServiceFactory = Callable[..., AbstractContextManager[Service]]
STEPS = 40
CHECKPOINT_EVERY = 2
LIMIT_S = 300.0  # generous: a loaded 2-core machine is slow

BODY: dict[str, Any] = {
    "name": "e2e-recovery",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2, "zero_stage": 2},
    "train": {
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 3e-3,
        "log_every": 1,
        "seed": 11,
    },
    # Storage checkpoints are what these tests restore from: no in-memory snapshots.
    "checkpoint": {"every_steps": CHECKPOINT_EVERY, "memory_every_steps": 0},
    # A hang limit load cannot reach: only the stopped-rank test is about hangs.
    "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 120},
}


MEMORY_EVERY = 3
# No storage checkpoint before the last step: only a snapshot in host memory can save the
# run. The same model, data and schedule as BODY, so one reference serves both.
SNAPSHOTS: dict[str, Any] = {
    **BODY,
    "name": "e2e-snapshots",
    "checkpoint": {"every_steps": 0, "memory_every_steps": MEMORY_EVERY},
}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(BODY), 2, on_metrics=metrics.append)
    return metrics


def alive(pid: int) -> bool:
    """Whether `pid` can still run: it exists and is not a zombie (killed, and waiting only
    for its parent, the raylet, to reap it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def gone_within(pid: int, timeout_s: float) -> bool:
    """Whether `pid` stops being able to run within `timeout_s`. The supervisor waits until
    Ray reports each killed actor dead, and Ray can report that a moment before a frozen
    process (one that cannot answer the kill) is killed or reaped."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


RECOVERED_MOVES = [
    ("QUEUED", "STARTING"),
    ("STARTING", "RUNNING"),
    ("RUNNING", "RESTARTING"),
    ("RESTARTING", "RUNNING"),
    ("RUNNING", "SUCCEEDED"),
]


def actor_pid(address: str, name: str) -> int:
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    actor = ray.get_actor(name, namespace=NAMESPACE)
    pid: Any = ray.get(actor.__ray_call__.remote(lambda self: os.getpid()), timeout=60)
    return int(pid)


def spares_ready(c: Client, address: str, job_id: str, before_step: int) -> bool:
    """Wait until the job's warm spares (its next attempt's named actors) have started,
    while the job is before `before_step`; whether they did."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    while c.get(job_id)["step"] < before_step:
        names = [
            a["name"]
            for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(worker_name(job_id, 2, 0).rsplit("-rank-", 1)[0] + "-rank-")
        ]
        try:
            actors = [ray.get_actor(name, namespace=NAMESPACE) for name in names]
            if len(actors) == 2 and ray.get([a.__ray_ready__.remote() for a in actors], timeout=1):
                return True
        except (ValueError, ray.exceptions.GetTimeoutError, ray.exceptions.RayActorError):
            pass
        time.sleep(0.2)
    return False


def finished(c: Client, job_id: str) -> dict[str, Any]:
    return wait_for(
        c, job_id, lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), LIMIT_S
    )


def assert_trained_like(c: Client, job_id: str, reference: list[dict[str, Any]]) -> list[str]:
    """Every step once, each loss as uninterrupted; returns the job's event messages."""
    metrics = c.metrics(job_id)
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), f"step {got['step']}"
    return [e["message"] for e in c.events(job_id, after=0)]


def process_ids(c: Client, job_id: str, rank: int) -> list[int]:
    """The process each world of the job trained `rank` in, from the rank's log."""
    said = c.logs(job_id, rank=rank, tail=1000, contains=f"rank {rank} trains in process")
    return [int(line.rsplit(" ", 1)[-1]) for line in said]


def test_worker_killed_recovers_from_the_snapshot_in_host_memory(
    service: ServiceFactory, reference: list[dict[str, Any]]
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(SNAPSHOTS)
        wait_for(c, job["id"], lambda j: j["step"] >= 8, LIMIT_S)
        snapshots = svc.settings.job_layout(job["id"]).snapshot_dir
        assert snapshots.is_dir()  # one host: the snapshots live here
        # The model's whole state in host memory: no other local user may enter.
        assert stat.S_IMODE(snapshots.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(snapshots.stat().st_mode) == 0o700
        # Killed by step 25 at the latest: a loaded machine may take seconds to find the
        # rank's process, and a kill as the job ends leaves no step to train again.
        warm = spares_ready(c, svc.ray_address, job["id"], before_step=STEPS - 15)
        pid = worker_pid(svc.ray_address, job["id"], 1)
        os.kill(pid, signal.SIGKILL)
        done = finished(c, job["id"])
        assert done["state"] == "SUCCEEDED", "\n".join(e["message"] for e in c.events(job["id"]))
        assert (done["restarts"], done["failures"]) == (1, 1)
        assert state_moves(c, job["id"]) == RECOVERED_MOVES
        events = assert_trained_like(c, job["id"], reference)
        # From host memory (no storage checkpoint exists before the end), after step 6 at
        # the earliest (killed at step 8 or later, snapshots every 3 steps).
        resumed(c, job["id"], tier="memory", after_at_least=6, lost_at_most=MEMORY_EVERY)
        # In place: rank 1 on a new process, rank 0 in the one it trained in before.
        assert len(process_ids(c, job["id"], 0)) == 2
        assert len(set(process_ids(c, job["id"], 0))) == 1, "rank 0 was restarted"
        assert len(set(process_ids(c, job["id"], 1))) == 2, "rank 1 was not replaced"
        checkpoints = c.checkpoints(job["id"])
        assert not alive(pid)
    assert any("rank 1: its actor died" in e for e in events), events
    # The spares import torch at the lowest priority beside the training ranks: on a slow
    # or busy machine they may still be starting at the kill. Started, the restart must
    # take them; still starting, it takes them only if they answer within its 5 s.
    if warm:
        assert "workers restarted in place on warm spares" in events, events
    else:
        assert any(e.startswith("workers restarted in place") for e in events), events
    restored = [e for e in events if e.startswith("restored checkpoint step")]
    assert len(restored) == 1, events
    step = int(restored[0].split()[3])
    assert step >= MEMORY_EVERY, restored
    recovered = [e for e in events if e.startswith("recovered in")]
    assert len(recovered) == 1 and f"resumed after step {step}," in recovered[0], events
    print(recovered[0])  # the MTTR measured, for docs/benchmarks.md
    # Snapshots are never reported as checkpoints, and are removed with the job.
    assert [ck["step"] for ck in checkpoints] == [STEPS]
    assert not snapshots.exists()


def test_stopped_rank_is_found_within_the_hang_limit_and_recovers(
    service: ServiceFactory, reference: list[dict[str, Any]]
) -> None:
    body = {**BODY, "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 8}}
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        wait_for(c, job["id"], lambda j: j["step"] >= 5, LIMIT_S)
        pid = worker_pid(svc.ray_address, job["id"], 0)
        os.kill(pid, signal.SIGSTOP)
        stopped_at = time.monotonic()
        try:
            wait_for(
                c, job["id"], lambda j: j["state"] == "RESTARTING" or j["restarts"] > 0, LIMIT_S
            )
            detected_s = time.monotonic() - stopped_at
        finally:
            os.kill(pid, signal.SIGCONT)  # if it was not killed; harmless if it was
        done = finished(c, job["id"])
        assert done["state"] == "SUCCEEDED", "\n".join(e["message"] for e in c.events(job["id"]))
        assert (done["restarts"], done["failures"]) == (1, 1)
        assert state_moves(c, job["id"]) == RECOVERED_MOVES
        events = assert_trained_like(c, job["id"], reference)
        resumed(c, job["id"], tier="storage", after_at_least=4, lost_at_most=CHECKPOINT_EVERY)
    assert gone_within(pid, 30), "the frozen worker's process is still there"
    # hang_timeout_s (8) plus one poll, plus the reconciler's and this loop's intervals
    assert detected_s < 8 + 5, detected_s
    assert any("rank 0: did not answer a poll in 8s" in e for e in events), events


def test_supervisor_killed_is_recreated_and_the_job_continues(
    service: ServiceFactory, reference: list[dict[str, Any]]
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(BODY)
        wait_for(c, job["id"], lambda j: j["step"] >= 5, LIMIT_S)
        os.kill(actor_pid(svc.ray_address, supervisor_name(job["id"])), signal.SIGKILL)
        done = finished(c, job["id"])
        assert done["state"] == "SUCCEEDED", "\n".join(e["message"] for e in c.events(job["id"]))
        assert (done["restarts"], done["failures"]) == (1, 1)
        events = assert_trained_like(c, job["id"], reference)
        resumed(c, job["id"], tier="storage", after_at_least=4, lost_at_most=CHECKPOINT_EVERY)
    said = "the job's supervisor is gone (failure 1 of at most 2); starting a new one"
    assert any(said in e for e in events), "\n".join(events)
    assert any(e.startswith("restored checkpoint step") for e in events), events


def test_a_job_that_cannot_build_fails_at_once_without_retrying(
    service: ServiceFactory, tmp_path: Path
) -> None:
    # It exists (a missing one is refused at submit) but holds no UTF-8 text.
    (tmp_path / "binary-corpus.txt").write_bytes(b"\xff\xfe\x00\x9f" * 64)
    body = {
        **BODY,
        "data": {"source": "text", "path": str(tmp_path / "binary-corpus.txt")},
        "model": {"preset": "tiny", "seq_len": 32, "vocab_size": 256},
    }
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        done = finished(c, job["id"])
        holds_nothing_within(svc.ray_address, job["id"], 60)  # a failed job too
    assert done["state"] == "FAILED" and done["restarts"] == 0, done
    assert "not retried" in done["failure_reason"]
    assert "no UTF-8 text found" in done["failure_reason"], done["failure_reason"]
