"""Starting the warm pool of rank processes (workers/runtime/warm_pool.py) with the
control plane, sized by its settings."""

from __future__ import annotations

import logging
from typing import Any

import ray

from shardline.service.config import Settings
from shardline.workers.contract.demand import PROCESS_BYTES
from shardline.workers.runtime.actors import WarmPoolActor
from shardline.workers.runtime.names import HEAD_RESOURCE, NAMESPACE, WARM_POOL_NAME

log = logging.getLogger(__name__)


def start_warm_pool(settings: Settings, runtime_env: dict[str, Any]) -> None:
    """Create the pool, or size the one a previous control plane left running (it is
    detached, like the supervisors: jobs keep the workers it handed them). With
    warm_workers_per_node 0 an existing pool stops its idle workers."""
    per_node, idle_s = settings.warm_workers_per_node, settings.warm_workers_idle_s
    pool: Any
    try:
        pool = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
    except ValueError:
        if per_node == 0:
            return
        pool = WarmPoolActor.options(
            name=WARM_POOL_NAME,
            namespace=NAMESPACE,
            lifetime="detached",
            get_if_exists=True,
            # Its workers inherit it: the data roots each rank reads from its environment.
            runtime_env=runtime_env,
            resources={HEAD_RESOURCE: 0.001},  # on the head node, like the supervisors
        ).remote(per_node, idle_s)
    pool.configure.remote(per_node, idle_s)
    log.info("warm pool: %d rank processes kept started on each node", per_node)


def idle_pool_bytes() -> float:
    """Host memory the pool's idle processes hold (ready or still starting): not any job's,
    so the scheduler admits against what is left. 0 where there is no pool, or it does not
    answer in a second (the scheduler's next tick asks again)."""
    try:
        pool = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
        counts: Any = ray.get(pool.counts.remote(), timeout=1.0)
    except Exception:  # no pool (off, or not started yet), or busy
        return 0.0
    return float((counts["ready"] + counts["starting"]) * PROCESS_BYTES)
