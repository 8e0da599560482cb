"""A local Ray head for a test tier: started like `shardline serve` starts one (with its
token), and stopped with every process it started, whatever the tests did."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from unittest import mock

import ray

from shardline.service.local_ray import LocalRay, start_local_ray

# Logical CPUs: an 8-rank CPU job fits a 2-core machine.
CLUSTER_CPUS = 8


@contextmanager
def attached(head: LocalRay) -> Iterator[LocalRay]:
    """This process's `ray.init` talks to `head` (its token, its loopback switch) until
    the block ends; then it is disconnected and the settings before are back. A test that
    starts a cluster of its own must not leave the tier's head unreachable for the tests
    after it (a token file that is gone, the single-machine switch flipped)."""
    constants = sys.modules.get("ray._private.ray_constants")
    saved_switch = getattr(constants, "ENABLE_RAY_CLUSTER", None)
    try:
        with mock.patch.dict(os.environ):  # the environment as it was, after the block
            head.use_auth()
            yield head
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if constants is not None:
            setattr(constants, "ENABLE_RAY_CLUSTER", saved_switch)  # noqa: B010


@contextmanager
def running_ray_head(state_dir: Path) -> Iterator[LocalRay]:
    """Start a loopback-only head, as `shardline serve` does, and attach this process to
    it: tests look at what Ray holds."""
    head = start_local_ray(state_dir, CLUSTER_CPUS)
    try:
        with attached(head):
            yield head
    finally:
        head.stop()
