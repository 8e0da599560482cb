"""What runs beside a worker group's own work, as Ray Train's WorkerGroupCallback: warm
spares, lending ranks from the warm pool, and removing a job's snapshots. The group calls
each hook at its point and does nothing else of theirs, so `poll()` only polls."""

from __future__ import annotations

from typing import Any, Protocol

from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerStatus
from shardline.workers.runtime.pool_lending import adopt_ranks, refill_pool, return_to_pool
from shardline.workers.runtime.snapshot_cleanup import remove_snapshots_on
from shardline.workers.runtime.spares import PastFirstStep, WarmSpares
from shardline.workers.storage.layout import CheckpointLocations, JobLayout


class WorkerGroup(Protocol):
    """What the callbacks see of the group they serve (workers/runtime/worker_group.py)."""

    spec: JobSpec
    layout: JobLayout
    locations: CheckpointLocations
    world_size: int
    actors: list[Any]
    node_of_rank: list[str]
    spares: WarmSpares

    @property
    def resources(self) -> dict[str, float]: ...

    def make_spares(self) -> None: ...


class WorkerGroupCallback:
    """Every hook does nothing unless a callback says otherwise."""

    def lend(self, group: WorkerGroup, nodes: dict[int, str]) -> dict[int, Any]:
        """Ready workers for ranks about to be started (rank -> its node), by rank; the
        group starts fresh actors for the others."""
        return {}

    def after_reserve(self, group: WorkerGroup) -> None:
        """A placement is ready: the ranks' nodes are known and their actors start next."""

    def after_start(self, group: WorkerGroup) -> None:
        """Every rank of a (re)start has joined the world and trains."""

    def after_poll(self, group: WorkerGroup, statuses: list[WorkerStatus]) -> None:
        """The ranks answered a poll (or were reported lost)."""

    def before_release(self, group: WorkerGroup) -> None:
        """The job is done with its ranks: they are killed next."""

    def after_release(self, group: WorkerGroup) -> None:
        """The ranks are gone and the placement group given back."""


class SpareMaking(WorkerGroupCallback):
    """Starts the next attempt's actors once every rank of this one has trained a step
    (workers/runtime/spares.py), so a restart finds them warm."""

    def after_poll(self, group: WorkerGroup, statuses: list[WorkerStatus]) -> None:
        if group.spares.due(statuses):
            group.make_spares()


class PoolLending(WorkerGroupCallback):
    """The job's side of the warm pool (workers/runtime/warm_pool.py): idle workers taken
    as its CPU ranks when it starts, the pool told to replace them once they train (or
    when the job ends first), and those that ended cleanly given back."""

    def __init__(self) -> None:
        self.refill: PastFirstStep | None = None  # when to tell the pool to refill
        self.lent: dict[Any, str] = {}  # the pool's workers the job took -> their nodes

    def lend(self, group: WorkerGroup, nodes: dict[int, str]) -> dict[int, Any]:
        res = group.resources
        if res.get("GPU"):
            return {}
        job = (group.layout, group.world_size, group.spec, group.locations, res["CPU"])
        taken = adopt_ranks(nodes, job)
        if taken:
            self.refill = PastFirstStep()
            self.lent.update({actor: nodes[rank] for rank, actor in taken.items()})
        return taken

    def after_poll(self, group: WorkerGroup, statuses: list[WorkerStatus]) -> None:
        if self.refill is not None and self.refill.passed(statuses):
            self.refill = None  # the pool replaces what this start took from it now
            refill_pool()

    def before_release(self, group: WorkerGroup) -> None:
        group.actors = return_to_pool(group.actors, self.lent)  # those it did not take
        self.lent.clear()
        if self.refill is not None:  # a short job: its successor finds the pool full
            self.refill = None
            refill_pool()


class SnapshotCleanup(WorkerGroupCallback):
    """Removes the job's in-memory snapshots from every node that may hold them (each rank
    writes into its own node's host memory: workers/engine/checkpoint/spread.py). A node
    counts from its placement, not from a finished start: a rank makes its snapshot
    folder while it starts, and a job cancelled then must not leave it behind."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()

    def after_reserve(self, group: WorkerGroup) -> None:
        if group.locations.snapshot_url is not None:
            self.nodes |= set(group.node_of_rank)

    def after_release(self, group: WorkerGroup) -> None:
        remove_snapshots_on(self.nodes, group.layout)
        self.nodes.clear()
