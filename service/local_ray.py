"""A local Ray head for the embedded default, run as its own process group.

`shardline serve` with no SHARDLINE_RAY_ADDRESS starts `ray start --head --block` in a new
session so it outlives the control plane: detached supervisors keep training while the
API restarts, and the next `serve` re-attaches to the same head (its address and pid are
kept in state_dir/ray/). Stopping that one process stops the whole head it started.

Anyone who can reach a Ray head can run code on it, so every port of the head's processes
listens on loopback only (see LOOPBACK_ENV), and the head requires Ray's token
authentication, with a token of its own kept in state_dir/ray/auth_token (mode 0600), or
the file RAY_AUTH_TOKEN_PATH names where the operator set one. The head, its workers (they
inherit the head's environment) and the control plane (through `LocalRay.use_auth`) all
name that file explicitly, so a `~/.ray/auth_token` left by some other Ray session
changes nothing. Ray reads its authentication settings when it is first imported: call
`use_auth` before anything imports ray.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from shardline.workers.contract.net import free_port
from shardline.workers.runtime.names import CORES_LABEL

log = logging.getLogger(__name__)

# Enough for metrics and control messages; training data never goes through it.
OBJECT_STORE_BYTES = 256 * 1024 * 1024

# Loopback only. Every Ray server (GCS, raylet and object manager, workers, agents, the
# Ray Client server) listens on 127.0.0.1 exactly when its node's IP is 127.0.0.1, but
# `ray start --node-ip-address=127.0.0.1` and ray.init rewrite a loopback address to the
# host's own (services.resolve_ip_for_localhost) unless Ray's single-machine switch is
# off: the one Ray uses on macOS and Windows, read from this variable when ray is
# imported. With it the head cannot take worker nodes, which an embedded head never has.
LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}


def _auth_token(state_dir: Path) -> Path:
    """The head's token file: RAY_AUTH_TOKEN_PATH's where set, else this state dir's,
    created (0600) on first use. Absolute: Ray's processes have other working directories."""
    given = os.environ.get("RAY_AUTH_TOKEN_PATH")
    if given:
        return Path(given).resolve()
    path = (state_dir / "ray" / "auth_token").resolve()
    if not path.is_file():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


# Secrets a storage client reads from its environment. The service's own reads of
# checkpoints use them; a job's ranks read their node's own (a profile, an instance role),
# or these where the operator passes them on (PASS_CREDENTIALS_ENV).
STORAGE_CREDENTIALS = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_KEY",
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_SAS_TOKEN",
)
PASS_CREDENTIALS_ENV = "SHARDLINE_PASS_STORAGE_CREDENTIALS"


def credentials_withheld() -> tuple[str, ...]:
    """The storage credentials of this process a Ray process it starts does not get: all of
    them, unless SHARDLINE_PASS_STORAGE_CREDENTIALS is 1 (or true, yes)."""
    passed = os.environ.get(PASS_CREDENTIALS_ENV, "").strip().lower() in ("1", "true", "yes")
    return () if passed else tuple(k for k in STORAGE_CREDENTIALS if k in os.environ)


@dataclass(frozen=True)
class LocalRay:
    address: str
    pid: int
    record: Path
    auth_token: Path
    # The embedded head is loopback-only; a test cluster that takes other nodes is not.
    loopback: bool = True
    # Ray's temp dir (sockets, session logs) lives in this folder, private to this user
    # (0700, a random name) and removed when the head is stopped.
    private_dir: Path | None = None

    @property
    def auth_env(self) -> dict[str, str]:
        """What a Ray process needs in its environment to talk to this head: its token,
        and a node address on loopback like the head's."""
        return {
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN_PATH": str(self.auth_token),
            **(LOOPBACK_ENV if self.loopback else {k: "1" for k in LOOPBACK_ENV}),
        }

    def process_env(self) -> dict[str, str]:
        """This process's environment for a Ray process joining this head: the head's token
        file, no RAY_AUTH_TOKEN of ours (it would take precedence over the file), and none
        of our storage credentials unless the operator passes them (every job's ranks
        inherit a node's environment: credentials_withheld)."""
        return {
            k: v
            for k, v in os.environ.items()
            if k != "RAY_AUTH_TOKEN" and k not in credentials_withheld()
        } | self.auth_env

    def use_auth(self) -> None:
        """Make this process's `ray.init` present the head's token and join it on
        loopback. Ray reads this when it is first imported, so call it before anything
        imports ray."""
        os.environ.pop("RAY_AUTH_TOKEN", None)  # it would take precedence over the file
        os.environ.update(self.auth_env)
        constants = sys.modules.get("ray._private.ray_constants")
        if constants is not None:
            # Imported already (a test process): the switch is read where it is used, so
            # setting it still makes this driver's node address loopback, as the head's.
            setattr(constants, "ENABLE_RAY_CLUSTER", not self.loopback)  # noqa: B010

    def stop(self, grace_s: float = 3.0) -> None:
        """Stop the head and every Ray process it started (all share its session)."""
        stop_session(self.pid, grace_s)
        self.record.unlink(missing_ok=True)
        if self.private_dir is not None:
            shutil.rmtree(self.private_dir, ignore_errors=True)
        log.info("stopped local Ray head %s", self.address)


def stop_session(sid: int, grace_s: float = 3.0) -> None:
    """Stop every process of session `sid` (a `ray start` begun in a new session, and all
    it started): SIGTERM, then SIGKILL what is left after `grace_s`."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in session_members(sid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and session_members(sid):
            time.sleep(0.2)
    _alive(sid)  # reaps it if it was our child


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


def _private_dir() -> Path:
    """A new folder for Ray's temp dir: only this user may enter it (Ray makes its own
    folders 0777 and its logs 0644), its name is not guessable, and its path is short
    (Ray puts unix sockets under it, and a socket path has at most ~107 characters)."""
    return Path(tempfile.mkdtemp(prefix="shardline-ray-", dir="/tmp"))


def find_local_ray(state_dir: Path) -> LocalRay | None:
    """The head this state dir started earlier, if it is still up."""
    record = state_dir / "ray" / "head.json"
    if not record.is_file():
        return None
    data = json.loads(record.read_text())
    private = data.get("private_dir")
    head = LocalRay(
        data["address"],
        int(data["pid"]),
        record,
        _auth_token(state_dir),
        data.get("loopback", True),
        Path(private) if private else None,
    )
    if _alive(head.pid) and _listening(head.address):
        return head
    record.unlink(missing_ok=True)
    return None


def start_local_ray(
    state_dir: Path, num_cpus: int, timeout_s: float = 90.0, *, loopback: bool = True
) -> LocalRay:
    """Reuse this state dir's running head, or start one with `num_cpus` logical CPUs.
    `loopback=False` (tests of several nodes on one host) lets other nodes join."""
    existing = find_local_ray(state_dir)
    if existing is not None:
        log.info("re-attaching to local Ray head %s", existing.address)
        return existing
    port = free_port()
    address = f"127.0.0.1:{port}"
    private = _private_dir()
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
        f"--temp-dir={private / 'ray'}",
        # Not Ray's fixed ports (10001, 52365): two heads on one host would both listen
        # there and split the ray:// connections between their clusters.
        f"--ray-client-server-port={free_port()}",
        f"--dashboard-agent-listen-port={free_port()}",
        # More logical CPUs than cores, so that several small ranks fit: the label keeps
        # the real count for the refusal of jobs that would crowd them.
        f"--labels={CORES_LABEL}={host_cores()}",
    ]
    token = _auth_token(state_dir)
    head = LocalRay(address, 0, log_dir / "head.json", token, loopback, private)
    env = head.process_env()
    env.update(startup_env(num_cpus, env))
    with (log_dir / "head.log").open("ab") as out:
        proc = subprocess.Popen(
            cmd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=env,
        )
    head = replace(head, pid=proc.pid)
    deadline = time.monotonic() + timeout_s
    while not _listening(address):
        if proc.poll() is not None or time.monotonic() > deadline:
            head.stop()
            raise RuntimeError(f"local Ray head did not start; see {log_dir / 'head.log'}")
        time.sleep(0.3)
    head.record.write_text(
        json.dumps(
            {"address": address, "pid": proc.pid, "loopback": loopback, "private_dir": str(private)}
        )
    )
    log.info("started local Ray head %s with %d logical CPUs", address, num_cpus)
    return head


STARTUP_CONCURRENCY_ENV = "RAY_worker_maximum_startup_concurrency"


def startup_env(num_cpus: int, env: dict[str, str]) -> dict[str, str]:
    """How many worker processes a node's raylet starts at once: its logical CPUs (the
    ranks that fit on it), not its cores, unless the operator set it. Ray's default, the
    cores, starts a job's ranks a few at a time, and its warning at four times that many
    processes ("8 PYTHON worker processes have been started ...") reaches every driver's
    output, the service's included, though a job's ranks, its supervisor and their warm
    spares are that many by design (SkyPilot raises it for the same reason)."""
    if STARTUP_CONCURRENCY_ENV in env:
        return {}
    return {STARTUP_CONCURRENCY_ENV: str(max(num_cpus, host_cores()))}


def host_cores() -> int:
    """The cores this process may run on (its affinity, where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1
