"""The warm pool on a real Ray cluster: a job's ranks are processes the pool started ahead,
and an adopted rank ends with the supervisor that adopted it, as a rank it started would."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray

from shardline.api.client import TERMINAL_STATES
from shardline.service.local_ray import LocalRay
from shardline.service.warm_pool import idle_pool_bytes
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.demand import PROCESS_BYTES
from shardline.workers.runtime.actors import WarmPoolActor
from shardline.workers.runtime.names import (
    HEAD_RESOURCE,
    NAMESPACE,
    WARM_POOL_NAME,
    supervisor_name,
)
from tests.e2e.conftest import new_service, wait_for
from tests.e2e.test_faults import admin_client
from tests.e2e.test_recovery import actor_pid, process_ids
from tests.support.databases import fresh_database

pytestmark = pytest.mark.timeout(240)

BODY: dict[str, Any] = {
    "name": "pooled",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2},
    "train": {"steps": 300, "global_batch_size": 2, "micro_batch_size": 1, "log_every": 10},
    "checkpoint": {"every_steps": 50},
}


def idle_pids(pool: Any) -> set[int]:
    """The processes of the pool's idle workers."""

    def pids(held: Any) -> list[int]:
        calls = [e.actor.__ray_call__.remote(lambda _: os.getpid()) for e in held.idle]
        return list(ray.get(calls, timeout=30))

    return set(ray.get(pool.__ray_call__.remote(pids), timeout=60))


def wait_until(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def no_pool() -> bool:
    """Whether the pool's name is free; kills a pool still holding it (another test's:
    a killed actor frees its name a moment later)."""
    try:
        ray.kill(ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE))
    except ValueError:
        return True
    return False


def running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def pool_on(ray_cluster: LocalRay, tmp_path: Path) -> Iterator[Any]:
    """A service with two warm workers per node; the pool is removed afterwards (it is
    detached: it would outlive this test's service on the shared cluster, its workers
    importing torch beside the next tests' jobs)."""
    with fresh_database("sqlite", tmp_path) as url:
        svc = new_service(url, ray_cluster.address, tmp_path, warm_workers_per_node=2)
        try:
            yield svc
        finally:
            if not ray.is_initialized():  # the service's stop shut this driver's Ray down
                ray.init(address=ray_cluster.address, namespace=NAMESPACE, log_to_driver=False)
            wait_until(no_pool, 30, "the warm pool to be gone")


def test_ranks_come_from_the_pool_and_die_with_their_supervisor(pool_on: Any) -> None:
    svc = pool_on
    with svc.running() as server, svc.client(server) as c:
        if not ray.is_initialized():
            ray.init(address=svc.ray_address, namespace=NAMESPACE, log_to_driver=False)
        pool: Any = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
        wait_until(lambda: ray.get(pool.counts.remote())["ready"] == 2, 120, "a warm pool")
        idle = idle_pids(pool)
        assert len(idle) == 2
        # The idle processes hold memory no job holds: the scheduler admits against the rest.
        assert idle_pool_bytes() == 2 * PROCESS_BYTES
        memory = float(ray.cluster_resources()["memory"])
        admitted = server.app.state.runtime._admission_total()["memory"]
        assert admitted == memory - 2 * PROCESS_BYTES

        job = c.submit(BODY)
        wait_for(c, job["id"], lambda j: j["step"] >= 3, 90)
        started = next(
            e for e in c.events(job["id"], after=0) if e["data"].get("kind") == "workers_started"
        )
        assert started["data"]["pooled_ranks"] == 2, started
        assert "2 of 2 from the warm pool" in started["message"]
        # Each rank's log names the process it trains in: the pool's, started before.
        assert {process_ids(c, job["id"], rank)[0] for rank in (0, 1)} == idle
        assert ray.get(pool.counts.remote())["handed_out"] == 2

        # The supervisor dies: its adopted ranks end too (a fresh supervisor restarts the
        # job, on other processes), never training on beside the new ones.
        os.kill(actor_pid(svc.ray_address, supervisor_name(job["id"])), signal.SIGKILL)
        wait_until(lambda: not any(running(pid) for pid in idle), 30, "the adopted ranks to end")
        done = wait_for(c, job["id"], lambda j: j["state"] == "SUCCEEDED", 150)
        assert (done["step"], done["restarts"]) == (300, 1)


def test_a_pooled_rank_reads_by_the_rules_of_the_service_that_runs_its_job(
    ray_cluster: LocalRay, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A pool left running by an earlier control plane with other data roots (a folder
    the corpus is not in) still hands out its workers; the ranks they become read by the
    data rules of the service running the job, as fresh ranks would."""
    elsewhere = tmp_path_factory.mktemp("the-earlier-roots")
    corpus = tmp_path / "corpus.txt"  # tmp_path is this service's data root
    corpus.write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    body = {
        "name": "pooled-reads",
        "model": {"preset": "tiny", "seq_len": 32},
        "data": {"source": "text", "path": str(corpus)},
        "parallel": {"dp": 2},
        "train": {"steps": 5, "global_batch_size": 2, "micro_batch_size": 1},
        "fault_tolerance": {"max_failures": 0},
    }
    if not ray.is_initialized():
        ray.init(address=ray_cluster.address, namespace=NAMESPACE, log_to_driver=False)
    wait_until(no_pool, 30, "an earlier test's pool to be gone")
    earlier: Any = WarmPoolActor.options(
        name=WARM_POOL_NAME,
        namespace=NAMESPACE,
        lifetime="detached",
        runtime_env={"env_vars": DataAccess.of([elsewhere], []).env_vars()},
        resources={HEAD_RESOURCE: 0.001},
    ).remote(2, 1800.0)
    try:
        wait_until(lambda: ray.get(earlier.counts.remote())["ready"] == 2, 120, "a warm pool")
        with fresh_database("sqlite", tmp_path) as url:
            svc = new_service(url, ray_cluster.address, tmp_path, warm_workers_per_node=2)
            with svc.running() as server, svc.client(server) as c:
                job = c.submit(body)
                done = wait_for(c, job["id"], lambda j: j["state"] in TERMINAL_STATES, 150)
                assert done["state"] == "SUCCEEDED", done["failure_reason"]
                started = next(
                    e
                    for e in c.events(job["id"], after=0)
                    if e["data"].get("kind") == "workers_started"
                )
                assert started["data"]["pooled_ranks"] == 2, started
    finally:
        with contextlib.suppress(Exception):  # gone already
            ray.kill(earlier)


def test_a_job_that_ended_gives_its_ranks_back_and_the_next_trains_alike_in_them(
    pool_on: Any,
) -> None:
    """A job that ends cleanly gives the pool back its ranks: the next job adopts those very
    processes (nothing left to import) and trains to the same losses as the first, its
    log lines in its own files only. A failed job's ranks are not given back."""
    svc = pool_on
    body = {**BODY, "name": "recycled", "train": {**BODY["train"], "steps": 6, "log_every": 1}}
    with svc.running() as server, svc.client(server) as c:
        if not ray.is_initialized():
            ray.init(address=svc.ray_address, namespace=NAMESPACE, log_to_driver=False)
        pool: Any = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
        wait_until(lambda: ray.get(pool.counts.remote())["ready"] == 2, 120, "a warm pool")

        runs: list[tuple[dict[str, Any], set[int], list[float]]] = []
        for _ in range(2):
            job = c.submit(body)
            done = wait_for(c, job["id"], lambda j: j["state"] in TERMINAL_STATES, 120)
            assert done["state"] == "SUCCEEDED", done["failure_reason"]
            pids = {process_ids(c, job["id"], rank)[0] for rank in (0, 1)}
            losses = [m["loss"] for m in c.metrics(job["id"])]
            runs.append((job, pids, losses))
            # Back in the pool, first in line (the pool keeps 2 per node: the
            # replacements it had started are stopped).
            assert idle_pids(pool) == pids
        (first, first_pids, first_losses), (second, second_pids, second_losses) = runs
        assert second_pids == first_pids
        assert len(first_losses) == 6 and second_losses == first_losses
        for rank in (0, 1):  # neither job's rank logs went into the other's files
            assert not c.logs(first["id"], rank=rank, tail=1000, contains=second["id"])
            assert not c.logs(second["id"], rank=rank, tail=1000, contains=first["id"])
            said = c.logs(first["id"], rank=rank, tail=1000, contains="back to the warm pool")
            assert len(said) == 1, said

        # A job whose rank fails keeps nothing of it in the pool: the failed process ends.
        failing = {**BODY, "name": "fails", "fault_tolerance": {"max_failures": 0}}
        job = c.submit(failing)
        wait_for(c, job["id"], lambda j: j["step"] >= 1, 90)
        with admin_client(svc, server) as admin:
            admin.inject_fault(job["id"], "raise", rank=1)
        done = wait_for(c, job["id"], lambda j: j["state"] in TERMINAL_STATES, 120)
        assert done["state"] == "FAILED"
        failed_pid = process_ids(c, job["id"], 1)[0]
        wait_until(lambda: not running(failed_pid), 30, "the failed rank to end")
        assert failed_pid not in idle_pids(pool)
