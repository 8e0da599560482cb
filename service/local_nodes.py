"""More Ray nodes on this machine, joined to a local head: a cluster of several nodes
for tests and benchmarks of node loss and preemption, with no second machine.

Each node is a `ray start --address` in a session of its own, at its own loopback address
(127.0.0.2, ...) and with its own host memory for snapshots (a folder standing for its
/dev/shm, named by SHARDLINE_SNAPSHOT_ROOT): on one machine the nodes would otherwise
share /dev/shm, and a lost node's snapshots would outlive it. Losing the node kills its
session and removes that folder.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from shardline.service.local_ray import (
    OBJECT_STORE_BYTES,
    LocalRay,
    session_members,
    startup_env,
    stop_session,
)
from shardline.workers.storage.snapshots import ROOT_ENV

log = logging.getLogger(__name__)

# A lost node is declared dead after about 3 s instead of Ray's default of about 30 s.
# Read by the head's GCS when it starts: set these where the head is started.
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_failure_threshold": "3"}


@dataclass(frozen=True)
class LocalNode:
    """A Ray node of its own on this machine: its session and its host memory."""

    session: int
    memory: Path
    ip: str

    def kill(self) -> None:
        """Lose the node at once: SIGKILL to its raylet and every worker it started, and
        its host memory with them."""
        for pid in session_members(self.session):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        stop_session(self.session, grace_s=1.0)  # reaps what is left
        shutil.rmtree(self.memory, ignore_errors=True)
        log.info("lost local Ray node %s", self.ip)


def start_local_node(head: LocalRay, folder: Path, name: str, ip: str, cpus: int) -> LocalNode:
    """A node with `cpus` logical CPUs joined to `head` (which must take other nodes:
    `start_local_ray(..., loopback=False)`); its log and host memory go under `folder`."""
    ray_bin = Path(sys.executable).parent / "ray"
    memory = folder / f"{name}-shm"
    env = head.process_env()
    env[ROOT_ENV] = str(memory)
    env.update(startup_env(cpus, env))
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / f"{name}.log").open("ab") as out:
        proc = subprocess.Popen(
            [
                str(ray_bin),
                "start",
                "--block",
                "--disable-usage-stats",
                f"--address={head.address}",
                f"--node-ip-address={ip}",
                f"--num-cpus={cpus}",
                f"--object-store-memory={OBJECT_STORE_BYTES}",
            ],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    log.info("started local Ray node %s (%d CPUs)", ip, cpus)
    return LocalNode(proc.pid, memory, ip)


def drain_for_preemption(head: LocalRay, node_id: str, deadline_s: int) -> None:
    """What a spot handler or an autoscaler asks of Ray when a node will go."""
    env = head.process_env()
    subprocess.run(
        [
            str(Path(sys.executable).parent / "ray"),
            "drain-node",
            f"--address={head.address}",
            f"--node-id={node_id}",
            "--reason=DRAIN_NODE_REASON_PREEMPTION",
            "--reason-message=spot instance reclaimed",
            f"--deadline-remaining-seconds={deadline_s}",
        ],
        env=env,
        check=True,
        timeout=60,
        capture_output=True,
    )
