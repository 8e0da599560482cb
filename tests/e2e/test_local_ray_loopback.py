"""The embedded Ray head listens on loopback only: every TCP port of every process it
started (GCS, raylet, object manager, workers, agents, Ray Client server), and of a job's
ranks (torch's rendezvous store, gloo)."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from contextlib import AbstractContextManager

import psutil
import ray

from shardline.service.local_ray import LocalRay, session_members
from tests.e2e.conftest import Service, job_spec, wait_for, worker_pid


@ray.remote(num_cpus=0.1)
def _square(x: int) -> int:
    return x * x


@ray.remote(num_cpus=0.1)
class _Echo:
    def ping(self) -> str:
        return "pong"


RAY_FIXED_PORTS = {10001, 52365}  # the Ray Client server's and the dashboard agent's


def _loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback  # a dual-stack socket bound to 127.0.0.1
    return address.is_loopback


def listening_sockets(head: LocalRay) -> set[tuple[str, str, int]]:
    """(process name, address, port) of every listening TCP socket of the head's session."""
    found = set()
    for pid in session_members(head.pid):
        try:
            process = psutil.Process(pid)
            connections = process.net_connections(kind="tcp")
            name = process.name()
        except psutil.Error:
            continue  # a worker that just exited
        for c in connections:
            if c.status == psutil.CONN_LISTEN:
                found.add((name, c.laddr.ip, c.laddr.port))
    return found


def test_every_port_of_the_embedded_head_is_on_loopback(ray_cluster: LocalRay) -> None:
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=ray_cluster.address, namespace="loopback-test", log_to_driver=False)
    # Workers and an actor run, so their own servers listen too.
    assert ray.get([_square.remote(i) for i in range(4)]) == [0, 1, 4, 9]
    echo = _Echo.remote()  # type: ignore[attr-defined]
    try:
        assert ray.get(echo.ping.remote()) == "pong"
        listening = listening_sockets(ray_cluster)
    finally:
        ray.kill(echo)
        if started_here:
            ray.shutdown()
    names = {name for name, _, _ in listening}
    assert {"gcs_server", "raylet"} <= names, listening
    exposed = sorted(s for s in listening if not _loopback(s[1]))
    assert exposed == [], f"listening beyond loopback: {exposed}"
    # Ray's fixed ports are not taken: a second head on the host would share them.
    assert not RAY_FIXED_PORTS & {port for _, _, port in listening}, listening


def test_every_port_of_a_running_job_is_on_loopback(
    ray_cluster: LocalRay, service: Callable[..., AbstractContextManager[Service]]
) -> None:
    """Rank 0's rendezvous store and every rank's gloo sockets included: torch's store
    answers anyone who connects."""
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(job_spec("sockets", steps=100_000))
        try:
            wait_for(c, job["id"], lambda j: j["state"] == "RUNNING" and j["step"] >= 2, 300)
            rank0 = worker_pid(svc.ray_address, job["id"], 0)
            listening = listening_sockets(ray_cluster)
            own = {
                (conn.laddr.ip, conn.laddr.port)
                for conn in psutil.Process(rank0).net_connections(kind="tcp")
                if conn.status == psutil.CONN_LISTEN
            }
        finally:
            c.cancel(job["id"])
        c.wait(job["id"], timeout=120)
    # The training rank listens (its store and gloo pairs, besides Ray's own server).
    assert len(own) >= 3, own
    exposed = sorted(s for s in listening if not _loopback(s[1]))
    assert exposed == [], f"listening beyond loopback while a job trains: {exposed}"
