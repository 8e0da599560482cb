"""Running `shardline serve` as a child process, for the demo and the benchmarks."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

from shardline.api.client import Client
from shardline.service.local_ray import find_local_ray
from shardline.workers.contract.net import free_port


@dataclass(frozen=True)
class LocalService:
    url: str
    token: str
    log_path: Path

    def client(self) -> Client:
        return Client(self.url, self.token)


@contextmanager
def local_service(
    state_dir: Path, startup_timeout_s: float = 180.0, server_src: Path | None = None
) -> Iterator[LocalService]:
    """`shardline serve` on its embedded defaults under `state_dir`; stopped on exit, with
    its local Ray head. `server_src`: serve the code of another checkout (a benchmark's
    "before")."""
    port = free_port()
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / "serve.log"
    env = {**os.environ, "SHARDLINE_STATE_DIR": str(state_dir), "SHARDLINE_PORT": str(port)}
    if server_src is not None:
        # Ahead of this checkout's editable install; Ray's processes inherit it.
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(server_src), env.get("PYTHONPATH")]))
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            [str(Path(sys.executable).parent / "shardline"), "serve"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + startup_timeout_s
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"shardline serve did not start; see {log_path}")
            time.sleep(0.3)
        token = (state_dir / "admin-token").read_text().strip()
        yield LocalService(url, token, log_path)
    finally:
        proc.send_signal(signal.SIGINT)  # serve stops its local Ray head when no job runs
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
        # With a job still running serve keeps its head, for the next serve to re-attach.
        # Nothing comes back to this state dir (a bench or a demo that stopped mid-job),
        # so the head goes too, with every job process it started.
        head = find_local_ray(state_dir)
        if head is not None:
            head.stop()
