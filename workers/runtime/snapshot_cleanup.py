"""Removing a job's in-memory snapshots from every node that may hold them (each rank
writes into its own node's host memory: workers/engine/checkpoint/spread.py)."""

from __future__ import annotations

import logging

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from shardline.workers.runtime.placement.node_health import alive_nodes
from shardline.workers.storage.layout import JobLayout
from shardline.workers.storage.snapshots import remove_snapshot_dir

log = logging.getLogger(__name__)

CLEANUP_TIMEOUT_S = 30.0


def remove_snapshots_on(nodes: set[str], layout: JobLayout) -> None:
    """On each of `nodes` still alive: remove the job's snapshot folder there."""
    remove = ray.remote(num_cpus=0)(_remove_snapshots_here)
    refs = [
        remove.options(scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)).remote(
            layout
        )
        for node in nodes & alive_nodes()
    ]
    try:
        ray.get(refs, timeout=CLEANUP_TIMEOUT_S)
    except Exception as err:  # never let cleanup keep a job from ending
        log.warning("job %s: removing snapshots failed: %s", layout.job_id, err)


def _remove_snapshots_here(layout: JobLayout) -> bool:
    """On one node: remove the job's snapshots there (its snapshot folder is that node's)."""
    return remove_snapshot_dir(layout.snapshot_dir)
