"""The whole service: a real local Ray cluster, a real database and the real server."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.placement_group import placement_group_table

from shardline.api.client import TERMINAL_STATES, Client
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.local_ray import LocalRay
from shardline.service.ray_runtime import RayRuntime
from shardline.service.store import JobStore
from shardline.workers.runtime.names import NAMESPACE, placement_group_name, worker_name
from tests.support.databases import fresh_database, migrated_with_token
from tests.support.ray_head import running_ray_head
from tests.support.server import RunningServer, run_server


@pytest.fixture(scope="session")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRay]:
    with running_ray_head(tmp_path_factory.mktemp("ray-state")) as head:
        yield head


@dataclass
class Service:
    settings: Settings
    database_url: str
    ray_address: str
    token: str

    @contextmanager
    def running(self) -> Iterator[RunningServer]:
        """Start the control plane (it can be stopped and started again)."""
        db = Database(self.database_url)
        runtime = RayRuntime(self.settings, JobStore(db), self.ray_address)
        try:
            with run_server(self.settings, runtime) as server:
                yield server
        finally:
            db.dispose()

    def client(self, server: RunningServer) -> Client:
        return Client(server.url, self.token)


@pytest.fixture
def service(
    ray_cluster: LocalRay, tmp_path: Path
) -> Callable[..., AbstractContextManager[Service]]:
    @contextmanager
    def make(database: str = "sqlite") -> Iterator[Service]:
        with fresh_database(database, tmp_path) as url:
            yield new_service(url, ray_cluster.address, tmp_path)

    return make


def new_service(url: str, ray_address: str, folder: Path, **settings: Any) -> Service:
    """A service over the empty database at `url` (migrated, with a user and their token)
    and the cluster at `ray_address`; its files under `folder`, which data may come from."""
    token = migrated_with_token(url, "e2e")
    defaults: dict[str, Any] = {
        "state_dir": folder / "state",
        "storage_root": folder / "storage",
        "data_roots": [folder],
        # Tests find a job's ranks by their actor names (worker_pid): pooled workers have
        # none. tests/e2e/test_warm_pool.py turns the pool on.
        "warm_workers_per_node": 0,
    }
    merged = {**defaults, **settings, "database_url": url, "ray_address": ray_address}
    return Service(Settings(**merged), url, ray_address, token)


def leftovers(address: str, job_id: str) -> dict[str, Any]:
    """The job's actors and placement groups that Ray still holds."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    actors = [
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if job_id in a["name"]
    ]
    groups = [
        g["state"]
        for g in placement_group_table().values()
        if g["name"] == placement_group_name(job_id) and g["state"] != "REMOVED"
    ]
    return {"actors": actors, "placement_groups": groups}


def holds_nothing_within(address: str, job_id: str, timeout_s: float) -> None:
    """Assert the job's actors and placement groups are gone within `timeout_s` (whatever
    state the job ended in: `wait_for` stops at a failed job)."""
    deadline = time.monotonic() + timeout_s
    while (held := leftovers(address, job_id)) != {"actors": [], "placement_groups": []}:
        assert time.monotonic() < deadline, held
        time.sleep(0.5)


def job_spec(name: str, **train: Any) -> dict[str, Any]:
    """A small two-rank job that logs every step."""
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
        # No condition these tests wait for can still come true once the job has failed;
        # nor, once it has ended, one it does not already meet: say so now, not at the
        # deadline.
        assert job["state"] != "FAILED", f"the job failed: {job['failure_reason']}"
        assert job["state"] not in TERMINAL_STATES, f"the job ended {job['state']}: {job}"
        assert time.monotonic() < deadline, f"timed out; job is {job['state']}: {job}"
        time.sleep(0.3)


def state_moves(client: Client, job_id: str) -> list[tuple[str, str]]:
    """The job's state transitions as (from, to), oldest first."""
    return [
        (e["data"]["from"], e["data"]["to"]) for e in client.events(job_id) if e["kind"] == "state"
    ]


def worker_pid(address: str, job_id: str, rank: int) -> int:
    """The process of the actor training `rank` now: the newest attempt's actor that has
    trained a step (a newer one may be an idle warm spare), never assumed attempt 1."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
    pattern = re.compile(
        r"-a(\d+)-".join(map(re.escape, worker_name(job_id, 0, rank).split("-a0-", 1))) + "$"
    )
    attempts = [
        int(m.group(1))
        for a in ray.util.list_named_actors(all_namespaces=True)
        if (m := pattern.match(a["name"]))
    ]
    # Ask every attempt's actor at once and take the first that has trained: a newer one
    # may be a warm spare still importing torch (its answer waits on that) or killed as the
    # job ends, and only one attempt's actors train at a time (older ones are torn down).
    # Read in place: poll() would take the metrics and events meant for the supervisor.
    pending: list[ray.ObjectRef[Any]] = []
    for attempt in attempts:
        try:
            actor = ray.get_actor(worker_name(job_id, attempt, rank), namespace=NAMESPACE)
        except ValueError:
            continue  # gone since it was listed
        pending.append(actor.__ray_call__.remote(lambda worker: (os.getpid(), worker._step)))
    deadline = time.monotonic() + 60
    while pending and (left := deadline - time.monotonic()) > 0:
        ready, pending = ray.wait(pending, num_returns=1, timeout=left)
        for ref in ready:
            try:
                pid, step = ray.get(ref)
            except ray.exceptions.RayActorError:
                continue  # a spare killed, or an old attempt's actor torn down
            if step > 0:
                return int(pid)
    raise AssertionError(f"no actor of job {job_id} has trained rank {rank}: {attempts}")


def resumed(
    client: Client,
    job_id: str,
    *,
    tier: str,
    after_at_least: int,
    lost_at_most: int | None,
) -> dict[str, Any]:
    """The job's one restore, asserted a real resume: after a step > 0 (at least
    `after_at_least`), from `tier` ("memory" or "storage"), and where a recovery was
    measured, the same step with at most `lost_at_most` steps trained again. A restore that
    found nothing and began at step 0 fails here: equal losses cannot tell it apart."""
    events = client.events(job_id, after=0)
    said = "\n".join(e["message"] for e in events)
    restores = [e["data"] for e in events if (e["data"] or {}).get("kind") == "restored"]
    assert len(restores) == 1, said
    (restore,) = restores
    assert restore["step"] >= max(after_at_least, 1), said
    assert restore["tier"] == tier, said
    recoveries = [e["data"] for e in events if (e["data"] or {}).get("kind") == "recovery"]
    if lost_at_most is not None:
        assert len(recoveries) == 1, said
        assert recoveries[0]["restored_step"] == restore["step"], recoveries[0]
        assert recoveries[0]["restored_tier"] == tier, recoveries[0]
        assert 0 <= recoveries[0]["steps_lost"] <= lost_at_most, recoveries[0]
    return restore
