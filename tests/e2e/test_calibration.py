"""The cluster's own rates: an administrator calibrates through the API (a Ray task on a
node of the real local cluster), the database keeps them across restarts, and plans and
`parallel: auto` say they used them."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.experimental import internal_kv

from shardline.api.client import Client, ShardlineError
from shardline.service.db import Database
from shardline.service.local_ray import LocalRay
from shardline.service.users import UserDirectory
from shardline.workers.contract.planner import default_rates
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.cluster_rates import planning_rates
from shardline.workers.runtime.names import NAMESPACE
from tests.e2e.conftest import Service, job_spec, leftovers, wait_for

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SHARDLINE = str(Path(sys.executable).parent / "shardline")


def admin_token(svc: Service) -> str:
    db = Database(svc.database_url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user(f"admin-{uuid.uuid4().hex[:6]}", admin=True), "t")
    db.dispose()
    return token.token


def calibrated(admin: Client, timeout_s: float = 120) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        answer = admin.cluster_rates()
        state = answer["calibration"]["state"]
        if state in ("done", "failed"):
            return answer
        assert time.monotonic() < deadline, answer
        time.sleep(0.5)


def connected(address: str) -> None:
    """This process on the session's cluster (a stopped server has left it)."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)


@pytest.fixture
def shared_rates_removed(ray_cluster: LocalRay) -> Iterator[None]:
    """The session's cluster is shared: later tests' elastic re-plans use the defaults."""
    yield
    connected(ray_cluster.address)
    for kind in ("cpu", "gpu"):
        internal_kv._internal_kv_del(f"rates/{kind}", namespace=NAMESPACE)


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@pytest.mark.usefixtures("shared_rates_removed")
def test_an_admin_calibrates_and_plans_use_the_rates(
    service: ServiceFactory, database: str
) -> None:
    spec = JobSpec.model_validate(job_spec("elastic"))
    with service(database) as svc:
        with svc.running() as server, svc.client(server) as user:
            admin_key = admin_token(svc)
            admin = Client(server.url, admin_key)
            before = user.cluster_rates()
            assert before == {"stored": [], "calibration": {"state": "idle", **NONE}}
            assert user.plan(job_spec("p"), ranks=2)["rates"] == "cpu default rates"
            with pytest.raises(ShardlineError) as refused:
                user.calibrate()
            assert refused.value.status == 403
            gpus = {**job_spec("g"), "resources": {"gpus_per_worker": 1}}
            with pytest.raises(ShardlineError) as no_gpu:  # a CPU cluster: nowhere to measure
                Client(server.url, admin_token(svc)).calibrate(gpus)
            assert no_gpu.value.status == 422, no_gpu.value

            started = admin.calibrate(ranks=2)
            assert started["state"] == "running" and started["kind"] == "cpu"
            with pytest.raises(ShardlineError) as twice:
                admin.calibrate()
            assert twice.value.status == 409 and "is running" in str(twice.value)
            answer = calibrated(admin)
            assert answer["calibration"]["state"] == "done", answer
            (stored,) = answer["stored"]
            rates = stored["rates"]
            assert stored["kind"] == "cpu" and rates["device"] == "cpu"
            assert rates["flops_per_s"] > 1e8 and rates["bandwidth"]["intra"] > 1e6
            assert rates["cores"] >= 1 and rates["runtime_bytes"] > 0
            assert "by admin-" in stored["source"] and "2 ranks" in stored["source"]
            used = user.plan(job_spec("p"), ranks=2)["rates"]
            assert used.startswith("cpu rates calibrated "), used
            # Supervisors' elastic re-plans read them from the cluster.
            assert planning_rates(spec).to_json() == rates

        connected(svc.ray_address)
        internal_kv._internal_kv_del("rates/cpu", namespace=NAMESPACE)
        assert planning_rates(spec) == default_rates(spec)

        # A restarted server plans with what the database kept, and shares it again.
        with svc.running() as server, svc.client(server) as user:
            assert user.cluster_rates()["stored"] == answer["stored"]
            assert planning_rates(spec).to_json() == rates
            if database == "sqlite":  # the command an administrator runs, once
                env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": admin_key}
                shown = subprocess.run(
                    [SHARDLINE, "calibrate", "--ranks", "2"],
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert shown.returncode == 0, shown.stderr
                assert "cpu rates stored" in shown.stdout and "GFLOP/s" in shown.stdout
                again = user.cluster_rates()["stored"][0]
                assert again["measured_at"] > answer["stored"][0]["measured_at"]
            job = user.submit({**job_spec("auto"), "parallel": {"auto": True, "max_pp": 1}})
            done = user.wait(job["id"], timeout=180, poll_s=0.5)
            assert done["state"] == "SUCCEEDED", done
            planned = [e for e in user.events(job["id"]) if e["data"].get("kind") == "planned"]
            assert "with cpu rates calibrated" in planned[0]["message"], planned
            # Nothing of it left on the session's cluster for the next test.
            wait_for(
                user, job["id"], lambda j: leftovers(svc.ray_address, j["id"])["actors"] == [], 60
            )


NONE = {"kind": None, "ranks": None, "started_at": None, "ended_at": None, "message": None}
