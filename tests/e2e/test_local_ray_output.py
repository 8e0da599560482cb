"""A Ray head started by the service keeps Ray's worker-pool warning out of every driver's
output (the service's own among them) when a node holds as many processes as it has room
for ranks: each rank, its job's supervisor and their warm spares are one each, by design."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from shardline.service.local_ray import host_cores, start_local_ray

# The driver a control plane is: connected while many actors start on the node.
DRIVER = textwrap.dedent(
    """
    import sys, time
    import ray

    ray.init(address=sys.argv[1], log_to_driver=False)

    @ray.remote(num_cpus=1)
    class Rank:
        def ready(self):
            return True

    ranks = [Rank.remote() for _ in range(int(sys.argv[2]))]
    ray.get([r.ready.remote() for r in ranks], timeout=240)
    time.sleep(3)  # what the raylet reports reaches the driver a moment later
    print("started", len(ranks))
    """
)


def test_a_node_full_of_ranks_says_nothing_in_the_drivers_output(tmp_path: Path) -> None:
    # Ray's default warns once the node's worker processes, less 8 it allows for its I/O
    # workers, reach four times its cores (20 actors on 2 cores were seen to warn).
    ranks = 4 * host_cores() + 12
    head = start_local_ray(tmp_path / "ray", ranks)
    try:
        run = subprocess.run(
            [sys.executable, "-c", DRIVER, head.address, str(ranks)],
            capture_output=True,
            text=True,
            env={**head.process_env(), "OMP_NUM_THREADS": "1"},
            timeout=300,
        )
    finally:
        head.stop()
    output = run.stdout + run.stderr
    assert run.returncode == 0, output
    assert f"started {ranks}" in run.stdout, output
    assert "worker processes have been started" not in output, output
