"""The warm pool: rank processes started ahead of any job, so a job's first step does not
wait for its processes to start and import torch.

One detached actor of the control plane (`WarmPoolActor`, named `WARM_POOL_NAME`) keeps
`per_node` idle `PooledWorker`s on every alive node with CPUs. They reserve nothing: a
job's placement group reserves its ranks' resources, as it does for warm spares. A job's
worker group asks the pool for idle workers on its ranks' nodes (`take`), makes each one a
rank (`adopt_ranks`, workers/runtime/pool_lending.py) and starts fresh actors for the
ranks it did not get. A worker is handed out once its process is up, though it may still
be importing torch: adopting it raises it to normal priority for the rest
(workers/runtime/pooled_worker.py), which is never slower than a fresh actor's start.
(Handing out ones whose imports kept the lowest priority, as once, took longer than fresh
actors.) The pool starts replacements once every rank of the job has trained a step
(`refill`, from the worker group's poll; `refill_after_s` after the take at the latest),
at the lowest CPU priority: on 2 busy cores, replacements started beside a job's start
delayed its first step reaching the API by 1-2 s. After `idle_s` without a take it stops
its idle workers, giving their memory back, until a job asks again. CPU ranks only: an
actor's GPUs are fixed when its process starts.

The pool owns the workers it started, adopted ones too: should it die, Ray ends them and
their jobs recover as from any lost rank.

A job that ended cleanly gives its adopted ranks back (`return_to_pool`, from the worker
group's release, before the job's end is recorded): each that `recycle()`s is idle again at
the head of its node's list, so the next job takes it first (nothing left to import), and
the pool stops what its node then holds over `per_node`, the newest (still importing)
first. Jobs back to back on 2 cores had each waited 1.3-2.6 s for replacements' imports.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

log = logging.getLogger(__name__)

TICK_S = 1.0
REFILL_AFTER_S = 30.0
# A process given back after this many jobs, or holding more than this, is stopped rather
# than kept (a fresh one replaces it): what each job leaves in a process's heap (the
# allocator's arenas, torch's caches) adds up, about 20 MB a tiny job, and a process that
# trained a large model on CPU keeps its heap at that size.
MAX_JOBS_PER_WORKER = 4
MAX_RECYCLED_BYTES = 1 << 30


def resident_bytes() -> int:
    """This process's resident memory now (Linux; 0 where it cannot be read)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return 0


@dataclass(frozen=True)
class Recycled:
    """A pooled rank's process, ready to be idle again: how many jobs it has served and
    what it holds."""

    jobs: int
    resident_bytes: int


@dataclass(frozen=True)
class Returned:
    node: str
    actor: Any
    recycled: Recycled


class Readiness(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEAD = "dead"


@dataclass
class Idle:
    node: str
    actor: Any
    probe: Any  # what tells whether the actor has started (a Ray object ref; None: it has)


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
                    (e for e in self.idle if e.node == node and self._state(e) == Readiness.READY),
                    None,
                )
                if entry is not None:
                    self.idle.remove(entry)
                    self.handed_out += 1
                taken.append(entry.actor if entry is not None else None)
        return taken

    def give_back(self, workers: list[Returned]) -> None:
        """Take back workers whose job ended cleanly, each recycled (idle and with
        everything imported): first in line on its node; a node over `per_node` then loses
        its newest. One that has served `MAX_JOBS_PER_WORKER` jobs or holds more than
        `MAX_RECYCLED_BYTES` is stopped instead, and replaced by a fresh one."""
        kept, worn = [], []
        for returned in workers:
            spent = returned.recycled
            if spent.jobs >= MAX_JOBS_PER_WORKER or spent.resident_bytes > MAX_RECYCLED_BYTES:
                worn.append(Idle(returned.node, returned.actor, None))
                log.info(
                    "warm pool: a worker that served %d jobs and holds %d MiB is stopped, not kept",
                    spent.jobs,
                    spent.resident_bytes >> 20,
                )
            else:
                kept.append(Idle(returned.node, returned.actor, None))
        with self._lock:
            self.idle[:0] = kept
        for entry in worn:
            self._stop(entry)
        self.maintain()

    def refill(self) -> None:
        """A job that took workers trains now: start their replacements."""
        with self._lock:
            self._hold_until = 0.0
        self.maintain()

    def counts(self) -> dict[str, int]:
        """Idle workers ready and still starting, and how many were ever handed out."""
        with self._lock:
            ready = sum(self._state(e) == Readiness.READY for e in self.idle)
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
                alive = entry.node in nodes and self._state(entry) != Readiness.DEAD
                (keep if alive and not resting else stopped).append(entry)
            self.idle = keep
            if resting and stopped:
                log.info(
                    "warm pool: idle for %.0f s, %d workers stopped", self.idle_s, len(stopped)
                )
            for node in sorted(nodes) if not resting else []:
                have = sum(e.node == node for e in self.idle)
                if now >= self._hold_until:  # no replacements while a job starts
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

    def _state(self, entry: Idle) -> Readiness:
        if entry.probe is None:  # given back by its job: started long ago
            return Readiness.READY
        return self._readiness(entry)

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
