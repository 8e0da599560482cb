"""A worker that dies or hangs on real Ray is torn down, replaced, and the job still succeeds."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

from shardline.api.client import Client
from tests.e2e.conftest import Service, job_spec, leftovers, state_moves, wait_for, worker_pid

ServiceFactory = Callable[..., AbstractContextManager[Service]]

STEPS = 30
VICTIM = 1  # the rank whose process is broken


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
    process (one that cannot answer the kill) is killed or reaped: CI once saw it still
    there right after its job ended."""
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


@contextlib.contextmanager
def reaped(pid: int) -> Iterator[None]:
    """Whatever the test asserts, leave no stopped or orphaned worker process behind."""
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def broken_then_done(
    c: Client, svc: Service, job_id: str, break_worker: Callable[[int], None]
) -> dict[str, Any]:
    """Break rank VICTIM once the job trains; the finished job (asserted SUCCEEDED)."""
    wait_for(c, job_id, lambda j: j["state"] == "RUNNING" and j["step"] >= 3, timeout=300)
    pid = worker_pid(svc.ray_address, job_id, VICTIM)
    with reaped(pid):
        break_worker(pid)
        done = c.wait(job_id, timeout=600, poll_s=0.5)
    assert done["state"] == "SUCCEEDED", done
    assert done["restarts"] == 1, done
    assert gone_within(pid, 30), "the broken worker's process is still there"
    # No resume step is asserted here: these 30-step jobs save only their last step, and
    # on a loaded machine the kill can land after it (then the restart restores step 30).
    # tests/e2e/test_recovery.py asserts resumes mid-run.
    moves = state_moves(c, job_id)
    assert moves == [
        ("QUEUED", "STARTING"),
        ("STARTING", "RUNNING"),
        ("RUNNING", "RESTARTING"),
        ("RESTARTING", "RUNNING"),
        ("RUNNING", "SUCCEEDED"),
    ]
    # The new workers trained to the end, and no step was stored twice or skipped.
    assert [m["step"] for m in c.metrics(job_id)] == list(range(1, STEPS + 1))
    wait_for(c, job_id, lambda j: leftovers(svc.ray_address, j["id"])["actors"] == [], 60)
    assert leftovers(svc.ray_address, job_id) == {"actors": [], "placement_groups": []}
    return done


def failure_messages(c: Client, job_id: str) -> list[str]:
    return [
        e["message"] for e in c.events(job_id) if e["kind"] == "event" and "failure" in e["message"]
    ]


def test_a_worker_killed_mid_run_is_replaced_and_the_job_succeeds(
    service: ServiceFactory,
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(job_spec("killed-worker", steps=STEPS))
        broken_then_done(c, svc, job["id"], lambda pid: os.kill(pid, signal.SIGKILL))
        (failure,) = failure_messages(c, job["id"])
        assert f"rank {VICTIM}: its actor died" in failure, failure


def test_a_frozen_worker_is_replaced_and_the_job_succeeds(service: ServiceFactory) -> None:
    # SIGSTOP: the process is alive but neither trains nor answers, like a wedged host.
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(job_spec("frozen-worker", steps=STEPS))
        broken_then_done(c, svc, job["id"], lambda pid: os.kill(pid, signal.SIGSTOP))
        (failure,) = failure_messages(c, job["id"])
        assert f"rank {VICTIM}: did not answer a poll" in failure, failure
