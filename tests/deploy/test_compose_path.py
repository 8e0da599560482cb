"""The path docker-compose takes, without Docker.

A PostgreSQL server, a Ray head and a second Ray node run as separate processes with Ray's
token authentication, and `shardline serve` from the installed wheel in a directory
outside the checkout; a 4-rank job spreads over both nodes.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import pytest

from shardline.api.client import Client
from shardline.service.local_ray import OBJECT_STORE_BYTES, stop_session
from shardline.workers.contract.net import free_port
from tests.deploy.conftest import InstalledWheel, outside_env
from tests.support.postgres_server import postgres_bindir, postgres_server

CPUS_PER_NODE = 2  # logical: a 4-rank job cannot fit on one node
NODE = [
    "--node-ip-address=127.0.0.1",
    f"--num-cpus={CPUS_PER_NODE}",
    f"--object-store-memory={OBJECT_STORE_BYTES}",
]


@contextmanager
def ray_node(
    installed: InstalledWheel, env: dict[str, str], log: Path, *args: str
) -> Iterator[None]:
    """`ray start --block ...` as its own session; every process of it is stopped after."""
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*installed.tool("ray"), "start", "--block", "--disable-usage-stats", *args, *NODE],
            env=env,
            cwd=installed.outside,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        yield
    finally:
        stop_session(proc.pid)


def _client_server_logs(ray_temp_dir: Path) -> str:
    """The head's Ray Client server logs: where a failed client connection says why."""
    logs = sorted(ray_temp_dir.glob("session_*/logs/ray_client_server*"))
    return "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}" for p in logs)


@contextmanager
def serve(
    installed: InstalledWheel, env: dict[str, str], log: Path, ray_temp_dir: Path
) -> Iterator[str]:
    """`shardline serve` from the wheel; yields its URL once it is ready."""
    url = f"http://127.0.0.1:{env['SHARDLINE_PORT']}"
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [*installed.tool("shardline"), "serve"],
            env=env,
            cwd=installed.outside,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 180
        while not _ready(url):
            assert proc.poll() is None, (
                f"serve exited: {log.read_text()[-3000:]}{_client_server_logs(ray_temp_dir)}"
            )
            assert time.monotonic() < deadline, f"serve not ready: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        yield url
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _ready(url: str) -> bool:
    try:
        return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def wait_for_port(port: int, timeout: float = 120) -> None:
    """Like compose's healthcheck on the head: start what needs it once it answers."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on port {port}"
            time.sleep(0.3)


def wait_for_cpus(client: Client, cpus: float, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while client.cluster()["resources"].get("CPU", 0) < cpus:
        assert time.monotonic() < deadline, f"the cluster has {client.cluster()['resources']}"
        time.sleep(1)


def test_four_ranks_over_two_ray_nodes_with_postgres_and_installed_serve(
    installed_wheel: InstalledWheel, tmp_path: Path
) -> None:
    bindir = postgres_bindir()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (no initdb); apt-get install postgresql")
    port = free_port()
    ray_env = outside_env(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(16))
    # Ray's unix sockets need a short path; tmp_path can be too long for them.
    temp_dir = Path(f"/tmp/shardline-deploy-{secrets.token_hex(4)}")
    # The API connects as a Ray Client, as in docker-compose, where its container runs no
    # raylet (a plain `host:port` driver needs one on its own machine).
    client_port = free_port()
    head = [f"--port={port}", "--head", "--include-dashboard=false", f"--temp-dir={temp_dir}"]
    head.append(f"--ray-client-server-port={client_port}")
    with ExitStack() as stack:
        stack.callback(shutil.rmtree, temp_dir, ignore_errors=True)
        database_url = stack.enter_context(postgres_server(bindir))
        stack.enter_context(ray_node(installed_wheel, ray_env, tmp_path / "head.log", *head))
        wait_for_port(port)
        stack.enter_context(
            ray_node(
                installed_wheel, ray_env, tmp_path / "node2.log", f"--address=127.0.0.1:{port}"
            )
        )
        wait_for_port(client_port)
        serve_env = {
            **ray_env,
            "SHARDLINE_DATABASE_URL": database_url,
            "SHARDLINE_RAY_ADDRESS": f"ray://127.0.0.1:{client_port}",
            "SHARDLINE_PORT": str(free_port()),
            "SHARDLINE_STATE_DIR": str(tmp_path / "state"),
            "SHARDLINE_STORAGE_ROOT": str(tmp_path / "storage"),
        }
        url = stack.enter_context(
            serve(installed_wheel, serve_env, tmp_path / "serve.log", temp_dir)
        )
        token = (tmp_path / "state" / "admin-token").read_text().strip()
        client = stack.enter_context(Client(url, token))
        wait_for_cpus(client, 2 * CPUS_PER_NODE)
        job = client.submit(
            {
                "name": "two-nodes",
                "model": {"preset": "tiny", "seq_len": 32},
                "parallel": {"dp": 4},
                "train": {"steps": 6, "global_batch_size": 4, "micro_batch_size": 1},
            }
        )
        done = client.wait(job["id"], timeout=300, poll_s=1)
        assert done["state"] == "SUCCEEDED", done
        messages = [e["message"] for e in client.events(job["id"])]
        assert "placement group ready: 4 ranks on 2 node(s)" in messages, messages
        # Every rank's log reached the storage the API reads.
        assert all(client.logs(job["id"], rank=r) for r in range(4))
