"""A job's side of the warm pool (workers/runtime/warm_pool.py): taking idle workers as
its ranks when it starts, telling the pool when to replace them, and giving them back
when it ends cleanly. Called from the job's worker group, in the supervisor's process."""

from __future__ import annotations

import logging
from typing import Any

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.runtime.names import NAMESPACE, WARM_POOL_NAME
from shardline.workers.runtime.warm_pool import Returned

log = logging.getLogger(__name__)

# How long a starting job waits for the pool, then for its workers to take their ranks:
# past these it starts fresh actors, as it would without a pool.
TAKE_TIMEOUT_S = 2.0
ADOPT_TIMEOUT_S = 10.0
# How long a released job waits for its ranks to say whether they go back to the pool
# (a clean rank answers at once; one that does not is killed, as before).
RECYCLE_TIMEOUT_S = 5.0


def adopt_ranks(nodes: dict[int, str], job: tuple[Any, ...]) -> dict[int, Any]:
    """Take idle workers for the ranks in `nodes` (rank -> its node), each made its rank
    of the job (`job`: `PooledWorker.adopt`'s arguments but the rank and the supervisor);
    returns those that took their rank, by rank. No pool, a pool that does not answer in
    time, or a worker that fails to adopt: those ranks are left for fresh actors."""
    import ray

    if not nodes:
        return {}
    layout, world_size, spec, locations, cpus = job
    try:  # what an adopted rank watches: the supervisor this runs in
        supervisor = ray.get_runtime_context().current_actor
    except Exception:
        supervisor = None
    try:
        pool = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
        workers: list[Any] = ray.get(pool.take.remote(list(nodes.values())), timeout=TAKE_TIMEOUT_S)
    except ValueError:  # no pool: warm_workers_per_node is 0, or the control plane is older
        return {}
    except Exception as err:
        log.warning("the warm pool did not answer (%s): fresh workers", type(err).__name__)
        return {}
    access = DataAccess.from_env()  # this supervisor's rules: its ranks' too
    calls = {
        rank: (
            worker,
            worker.adopt.remote(
                layout, rank, world_size, spec, locations, cpus, supervisor, access
            ),
        )
        for rank, worker in zip(nodes, workers, strict=True)
        if worker is not None
    }
    adopted: dict[int, Any] = {}
    for rank, (worker, ref) in calls.items():
        try:
            ray.get(ref, timeout=ADOPT_TIMEOUT_S)
        except Exception as err:
            log.warning("a pooled worker did not take rank %d (%s): a fresh one", rank, err)
            ray.kill(worker, no_restart=True)
            continue
        adopted[rank] = worker
    return adopted


def refill_pool() -> None:
    """Tell the warm pool that the ranks it handed out train: it may replace them now."""
    import ray

    try:
        ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE).refill.remote()
    except Exception as err:  # gone meanwhile: it refills on its own timer, or not at all
        log.info("the warm pool was not told to refill (%s)", type(err).__name__)


def return_to_pool(actors: list[Any], lent: dict[Any, str]) -> list[Any]:
    """Give the warm pool back those of a job's ranks (`actors`) that it lent (`lent`:
    actor -> node), once the job has ended: each that may be reused
    (`PooledWorker.recycle`) is the pool's idle worker again. Returns the ranks it did not
    take; the caller kills them, as it kills fresh ranks."""
    import ray

    workers = {a: lent[a] for a in actors if a in lent}
    if not workers:
        return actors
    try:
        pool = ray.get_actor(WARM_POOL_NAME, namespace=NAMESPACE)
    except ValueError:  # the pool is gone (or off): its workers die with it anyway
        return actors
    calls = {actor: actor.recycle.remote() for actor in workers}
    back: list[Returned] = []
    for actor, ref in calls.items():
        try:
            recycled = ray.get(ref, timeout=RECYCLE_TIMEOUT_S)
        except Exception as err:  # died, or still busy: killed with the others
            log.info("a pooled rank was not recycled (%s)", type(err).__name__)
            continue
        if recycled is not None:
            back.append(Returned(workers[actor], actor, recycled))
    if not back:
        return actors
    try:  # waited for, so the next job's take finds them
        ray.get(pool.give_back.remote(back), timeout=TAKE_TIMEOUT_S)
    except Exception as err:
        log.warning("the warm pool did not take its workers back (%s)", type(err).__name__)
        return actors  # killed by the caller: none is left idle outside the pool
    taken = {r.actor for r in back}
    return [a for a in actors if a not in taken]
