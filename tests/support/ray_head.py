"""A local Ray head for a test tier: started like `shardline serve` starts one (with its
token), and stopped with every process it started, whatever the tests did."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import ray

from service.local_ray import LocalRay, start_local_ray

# Logical CPUs: an 8-rank CPU job fits a 2-core machine.
CLUSTER_CPUS = 8


@contextmanager
def running_ray_head(state_dir: Path) -> Iterator[LocalRay]:
    head = start_local_ray(state_dir, CLUSTER_CPUS)
    head.use_auth()  # this process's ray.init (tests look at what Ray holds) needs it
    try:
        yield head
    finally:
        if ray.is_initialized():
            ray.shutdown()
        head.stop()
