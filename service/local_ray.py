"""A local Ray head for the embedded default, run as its own process group.

`shardline serve` with no SHARDLINE_RAY_ADDRESS starts `ray start --head --block` in a new
session so it outlives the control plane: detached supervisors keep training while the
API restarts, and the next `serve` re-attaches to the same head (its address and pid are
kept in state_dir/ray/). Stopping that one process stops the whole head it started.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from workers.engine.distributed import free_port

log = logging.getLogger(__name__)

# Enough for metrics and control messages; training data never goes through it.
OBJECT_STORE_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class LocalRay:
    address: str
    pid: int
    record: Path

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the head and every Ray process it started (all share its session)."""
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in session_members(self.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, sig)
            deadline = time.monotonic() + grace_s
            while time.monotonic() < deadline and session_members(self.pid):
                time.sleep(0.2)
        _alive(self.pid)  # reaps it if it was our child
        self.record.unlink(missing_ok=True)
        log.info("stopped local Ray head %s", self.address)


def session_members(sid: int) -> list[int]:
    """Live processes of session `sid`. Ray gives workers their own process groups, but
    they stay in the session of the `ray start` that was started with a new session."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        # After the command name: state, ppid, pgrp, session, ...
        if int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child still answers kill(0); reap it if it is ours.
    try:
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def _listening(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=1):
            return True
    except OSError:
        return False


def _temp_dir(state_dir: Path) -> Path:
    # Ray puts unix sockets under its temp dir; keep the path short (sockets max ~107 chars).
    digest = hashlib.sha256(str(state_dir.resolve()).encode()).hexdigest()[:10]
    return Path("/tmp") / f"shardline-ray-{digest}"


def find_local_ray(state_dir: Path) -> LocalRay | None:
    """The head this state dir started earlier, if it is still up."""
    record = state_dir / "ray" / "head.json"
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    head = LocalRay(data["address"], int(data["pid"]), record)
    if _alive(head.pid) and _listening(head.address):
        return head
    record.unlink(missing_ok=True)
    return None


def start_local_ray(state_dir: Path, num_cpus: int, timeout_s: float = 90.0) -> LocalRay:
    """Reuse this state dir's running head, or start one with `num_cpus` logical CPUs."""
    existing = find_local_ray(state_dir)
    if existing is not None:
        log.info("re-attaching to local Ray head %s", existing.address)
        return existing
    port = free_port()
    address = f"127.0.0.1:{port}"
    ray_bin = Path(sys.executable).parent / "ray"
    log_dir = state_dir / "ray"
    log_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        str(ray_bin),
        "start",
        "--head",
        "--block",
        f"--port={port}",
        f"--num-cpus={num_cpus}",
        "--include-dashboard=false",
        "--disable-usage-stats",
        f"--object-store-memory={OBJECT_STORE_BYTES}",
        "--node-ip-address=127.0.0.1",
        f"--temp-dir={_temp_dir(state_dir)}",
    ]
    with (log_dir / "head.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    head = LocalRay(address, proc.pid, log_dir / "head.json")
    deadline = time.monotonic() + timeout_s
    while not _listening(address):
        if proc.poll() is not None or time.monotonic() > deadline:
            head.stop()
            raise RuntimeError(f"local Ray head did not start; see {log_dir / 'head.log'}")
        time.sleep(0.3)
    head.record.write_text(json.dumps({"address": address, "pid": proc.pid}))
    log.info("started local Ray head %s with %d logical CPUs", address, num_cpus)
    return head
