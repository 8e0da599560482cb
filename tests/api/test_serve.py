"""`shardline serve` on its embedded defaults: SQLite under ./.shardline, an admin token,
and a local Ray head that goes away with the server."""

from __future__ import annotations

import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from shardline.service.db import Database
from shardline.service.local_ray import LocalRay, find_local_ray, session_members
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.net import free_port
from shardline.workers.contract.spec import JobSpec

SHARDLINE = str(Path(sys.executable).parent / "shardline")


def stop(proc: subprocess.Popen[str]) -> str:
    """Stop `shardline serve` as Ctrl-C does (killed if it does not exit); its output."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, _ = proc.communicate()
    return out


def head_is_gone(head: LocalRay) -> bool:
    """No process of the Ray head's session is left (zombies awaiting a reaper aside)."""
    return not session_members(head.pid)


@contextmanager
def serving(cwd: Path, port: int) -> Iterator[subprocess.Popen[str]]:
    """`shardline serve` in `cwd`. Whatever the test asserts, neither the server nor the
    Ray head it started outlives the test."""
    proc = subprocess.Popen(
        [SHARDLINE, "serve", "--port", str(port)],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")},
    )
    try:
        deadline = time.monotonic() + 120
        while not _ready(port):
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"serve did not become ready: {stop(proc)}")
            time.sleep(0.2)
        yield proc
    finally:
        stop(proc)
        head = find_local_ray(cwd / ".shardline")
        if head is not None:
            head.stop()


def _ready(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def test_first_start_creates_an_admin_token_once(tmp_path: Path) -> None:
    port = free_port()
    state = tmp_path / ".shardline"
    state.mkdir(mode=0o755)  # as an older version left it: readable by anyone
    with serving(tmp_path, port) as first:
        # The state folder and what is in it are the service's user's alone.
        assert stat.S_IMODE(state.stat().st_mode) == 0o700
        for path in [state / "shardline.db", *state.rglob("*")]:
            assert stat.S_IMODE(path.stat().st_mode) & 0o077 == 0, path
        token_file = state / "admin-token"
        token = token_file.read_text().strip()
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        assert (state / "shardline.db").is_file()
        head = find_local_ray(state)
        assert head is not None, "serve started no local Ray head"
        # Ray's sockets and session logs: in a folder of a random name only we may enter.
        assert head.private_dir is not None and head.private_dir.name != "shardline-ray"
        assert stat.S_IMODE(head.private_dir.stat().st_mode) == 0o700
        assert (head.private_dir / "ray").is_dir()
        jobs = subprocess.run(
            [SHARDLINE, "jobs"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            env={**os.environ, "SHARDLINE_PORT": str(port)},
        )
        assert jobs.returncode == 0, jobs.stderr  # the CLI found the saved token by itself
        out = stop(first)
        assert token in out  # printed once, on first start
        # With how to log the CLI in from any other folder.
        assert f"shardline login --url http://127.0.0.1:{port} --token {token}" in out, out
        # With no job running, serve took its Ray head down with it, and its temp dir.
        assert find_local_ray(state) is None and head_is_gone(head)
        assert not head.private_dir.exists()

    paused_job(f"sqlite:///{state / 'shardline.db'}")
    with serving(tmp_path, port) as second:
        headers = {"Authorization": f"Bearer {token}"}
        listed = httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=headers).json()
        assert [j["state"] for j in listed["jobs"]] == ["PAUSED"]
        head = find_local_ray(state)
        assert head is not None
        out = stop(second)
        assert "shl_" not in out and token_file.read_text().strip() == token
        # Every start says where the token is and how to log in from elsewhere.
        login = f'shardline login --url http://127.0.0.1:{port} --token "$(cat {token_file})"'
        assert login in out, out
        # A paused job holds nothing on Ray: the head goes down with serve all the same.
        assert find_local_ray(state) is None and head_is_gone(head), out


def paused_job(database_url: str) -> None:
    """A job that ran and was paused, written while no server runs (no scheduler can
    start it, no reconciler look at it, half way)."""
    db = Database(database_url)
    try:
        store, users = JobStore(db), UserDirectory(db)
        job, _ = store.create(users.ensure_user("pauser"), JobSpec(name="paused"))
        for state in (JobState.STARTING, JobState.RUNNING, JobState.PAUSING, JobState.PAUSED):
            store.transition(job.id, state, "test")
    finally:
        db.dispose()


def test_sigterm_stops_serve_cleanly_and_takes_its_idle_ray_head_down(tmp_path: Path) -> None:
    """What `docker stop`, systemd and Kubernetes send: a clean exit, not a traceback."""
    port = free_port()
    with serving(tmp_path, port) as proc:
        head = find_local_ray(tmp_path / ".shardline")
        assert head is not None
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, out
        assert "Traceback" not in out, out
        assert find_local_ray(tmp_path / ".shardline") is None and head_is_gone(head)


def test_sigterm_while_a_job_cancels_finishes_the_cancel_then_the_head(tmp_path: Path) -> None:
    """A job cancelled just before serve is stopped: serve finishes the cancel within its
    grace, records it, and takes its Ray head down (it used to leave the job CANCELLING and
    the head and the job's supervisor running until the next serve)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with serving(tmp_path, port) as proc:
        head = find_local_ray(tmp_path / ".shardline")
        assert head is not None
        token = (tmp_path / ".shardline" / "admin-token").read_text().strip()
        auth = {"Authorization": f"Bearer {token}"}
        spec = {
            "name": "cancelled",
            "model": {"preset": "tiny", "seq_len": 32},
            "train": {"steps": 100_000, "global_batch_size": 2, "micro_batch_size": 1},
        }
        job = httpx.post(f"{url}/v1/jobs", json=spec, headers=auth, timeout=30).json()
        deadline = time.monotonic() + 180
        while httpx.get(f"{url}/v1/jobs/{job['id']}", headers=auth, timeout=30).json()["step"] < 1:
            assert time.monotonic() < deadline, "the job did not train"
            time.sleep(0.5)
        cancelled = httpx.post(f"{url}/v1/jobs/{job['id']}/cancel", headers=auth, timeout=30)
        assert cancelled.json()["state"] == "CANCELLING"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, out
        assert "Leaving the local Ray head running" not in out, out
        assert find_local_ray(tmp_path / ".shardline") is None and head_is_gone(head), out
    db = Database(f"sqlite:///{tmp_path / '.shardline' / 'shardline.db'}")
    try:
        assert JobStore(db).get(job["id"]).state == JobState.CANCELLED
    finally:
        db.dispose()


def test_a_port_in_use_is_one_line_naming_the_setting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [SHARDLINE, "serve", "--port", str(port)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")},
        )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"error: 127.0.0.1:{port} is in use; choose another with --port or SHARDLINE_PORT "
        "(and --host or SHARDLINE_HOST)"
    ]
    assert "Shardline on" not in done.stdout  # never announced
    assert find_local_ray(tmp_path / ".shardline") is None  # nothing started
