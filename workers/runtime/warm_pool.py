"""The warm pool: rank processes started ahead of any job, so a job's first step does not
wait for its processes to start and import torch.

One detached actor of the control plane (`WarmPoolActor`, named `WARM_POOL_NAME`) keeps
`per_node` idle `PooledWorker`s on every alive node with CPUs. They reserve nothing: a
job's placement group reserves its ranks' resources, as it does for warm spares. A job's
worker group asks the pool for idle workers on its ranks' nodes (`take`), makes each one a
rank (`adopt_ranks`) and starts fresh actors for the ranks it did not get. A worker is
handed out once its process is up, though it may still be importing torch: adopting it
raises it to normal priority for the rest (workers/runtime/pooled_worker.py), which is
never slower than a fresh actor's start. (Handing out ones whose imports kept the lowest
priority, as once, took longer than fresh actors.) The pool
starts replacements once every rank of the job has trained a step (`refill`, from the
worker group's poll; `refill_after_s` after the take at the latest), at the lowest CPU
priority: on 2 busy cores, replacements started beside a job's start delayed its first
step reaching the API by 1-2 s. After `idle_s` without a take it stops its idle workers,
giving their memory back, until a job asks again. CPU ranks only: an actor's GPUs are
fixed when its process starts.

The pool owns the workers it started, adopted ones too: should it die, Ray ends them and
their jobs recover as from any lost rank.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from workers.contract.data_access import DataAccess
from workers.runtime.names import NAMESPACE, WARM_POOL_NAME

log = logging.getLogger(__name__)

# How long a starting job waits for the pool, then for its workers to take their ranks:
# past these it starts fresh actors, as it would without a pool.
TAKE_TIMEOUT_S = 2.0
ADOPT_TIMEOUT_S = 10.0
TICK_S = 1.0
REFILL_AFTER_S = 30.0


class Readiness(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"


@dataclass
class Idle:
    node: str
    actor: Any
    probe: Any  # what tells whether the actor has started (a Ray object ref)


class WarmPool:
    """The pool's bookkeeping. The Ray calls are the four methods a subclass may replace
    (`_start`, `_readiness`, `_stop`, `_nodes`): unit tests replace them."""

    def __init__(
        self,
        per_node: int,
        idle_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        tick_s: float | None = TICK_S,
        refill_after_s: float = REFILL_AFTER_S,
    ) -> None:
        self.per_node, self.idle_s = per_node, idle_s
        self.refill_after_s = refill_after_s
        self.clock = clock
        self.idle: list[Idle] = []
        self.handed_out = 0
        self._last_take = clock()
        self._hold_until = 0.0  # no replacements before this (a job is starting); 0: now
        self._lock = threading.Lock()
        self._closed = threading.Event()
        if tick_s is not None:
            threading.Thread(target=self._loop, args=(tick_s,), daemon=True).start()

    # -- what the control plane and the worker groups call ---------------------------

    def configure(self, per_node: int, idle_s: float) -> None:
        with self._lock:
            self.per_node, self.idle_s = per_node, idle_s
        self.maintain()

    def take(self, nodes: list[str]) -> list[Any | None]:
        """An idle, started worker on each of `nodes` (None where there is none): each is
        the caller's from now on. The pool replaces them once the job trains."""
        with self._lock:
            self._last_take = self.clock()
            self._hold_until = self._last_take + self.refill_after_s
            taken: list[Any | None] = []
            for node in nodes:
                entry = next(
                    (
                        e
                        for e in self.idle
                        if e.node == node and self._readiness(e) == Readiness.READY
                    ),
                    None,
                )
                if entry is not None:
                    self.idle.remove(entry)
                    self.handed_out += 1
                taken.append(entry.actor if entry is not None else None)
        return taken

    def refill(self) -> None:
        """A job that took workers trains now: start their replacements."""
        with self._lock:
            self._hold_until = 0.0
        self.maintain()

    def counts(self) -> dict[str, int]:
        """Idle workers ready and still starting, and how many were ever handed out."""
        with self._lock:
            ready = sum(self._readiness(e) == Readiness.READY for e in self.idle)
            return {
                "ready": ready,
                "starting": len(self.idle) - ready,
                "handed_out": self.handed_out,
            }

    def close(self) -> None:
        """Stop the idle workers and the upkeep (those handed out are their jobs')."""
        self._closed.set()
        with self._lock:
            idle, self.idle = self.idle, []
        for entry in idle:
            self._stop(entry)

    # -- upkeep --------------------------------------------------------------------------

    def maintain(self) -> None:
        """Drop the dead and those on gone nodes; fill every node up to `per_node`, or
        stop them all once the pool has been idle for `idle_s`."""
        if self._closed.is_set():
            return
        nodes = self._nodes()
        stopped: list[Idle] = []
        with self._lock:
            now = self.clock()
            resting = now - self._last_take > self.idle_s
            keep: list[Idle] = []
            for entry in self.idle:
                alive = entry.node in nodes and self._readiness(entry) != Readiness.DEAD
                (keep if alive and not resting else stopped).append(entry)
            self.idle = keep
            if resting and stopped:
                log.info(
                    "warm pool: idle for %.0f s, %d workers stopped", self.idle_s, len(stopped)
                )
            if not resting and now >= self._hold_until:
                for node in sorted(nodes):
                    have = sum(e.node == node for e in self.idle)
                    for _ in range(self.per_node - have):
                        self.idle.append(self._start(node))
                    surplus = [e for e in self.idle if e.node == node][self.per_node :]
                    for entry in surplus:
                        self.idle.remove(entry)
                        stopped.append(entry)
        for entry in stopped:
            self._stop(entry)

    def _loop(self, tick_s: float) -> None:
        while not self._closed.wait(tick_s):
            try:
                self.maintain()
            except Exception:  # the next tick tries again; a pool never stops over one
                log.exception("warm pool: upkeep failed")

    # -- the Ray calls ---------------------------------------------------------------------

    def _start(self, node: str) -> Idle:
        raise NotImplementedError

    def _readiness(self, entry: Idle) -> Readiness:
        import ray

        ready, _ = ray.wait([entry.probe], timeout=0)
        if not ready:
            return Readiness.STARTING
        try:
            ray.get(entry.probe)
        except Exception:
            return Readiness.DEAD
        return Readiness.READY

    def _stop(self, entry: Idle) -> None:
        import ray

        ray.kill(entry.actor, no_restart=True)

    def _nodes(self) -> set[str]:
        """The alive nodes that can hold a CPU rank."""
        import ray

        return {n["NodeID"] for n in ray.nodes() if n["Alive"] and n["Resources"].get("CPU", 0) > 0}


def adopt_ranks(nodes: dict[int, str], job: tuple[Any, ...]) -> dict[int, Any]:
    """Take idle workers for the ranks in `nodes` (rank -> its node), each made its rank
    of the job (`job`: `PooledWorker.adopt`'s arguments but the rank and the supervisor);
    returns those that took their rank, by rank. No pool, a pool that does not answer in
    time, or a worker that fails to adopt: those ranks are left for fresh actors."""
    import ray

    if not nodes:
        return {}
    layout, world_size, spec_json, locations, cpus = job
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
                layout, rank, world_size, spec_json, locations, cpus, supervisor, access
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
