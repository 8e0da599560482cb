"""The ranks of one job: a placement group with one bundle per rank, one actor per bundle.

Ranks are ordered by node so that neighbouring ranks (a tensor-parallel group, tp being the
fastest-varying mesh dim) share a node. The worker actor class is handed in (see
workers/runtime/actors.py), so this module imports no actor and no supervisor; so are the
callbacks that run beside it (warm spares, the warm pool, snapshot cleanup:
workers/runtime/group_callbacks.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from shardline.workers.contract.demand import bundle_resources, warm_spares_wanted
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerStatus
from shardline.workers.runtime.group_callbacks import WorkerGroupCallback
from shardline.workers.runtime.joining import wait_for_start
from shardline.workers.runtime.names import NAMESPACE, placement_group_name, worker_name
from shardline.workers.runtime.placement.node_health import alive_nodes, free_outside
from shardline.workers.runtime.spares import WarmSpares, kill_and_confirm
from shardline.workers.runtime.supervisor.workers import InPlaceRefused, NodeLost
from shardline.workers.storage.layout import CheckpointLocations, JobLayout

log = logging.getLogger(__name__)

# Ray labels every node with its id; a placement group can be kept off some nodes by it.
NODE_ID_LABEL = "ray.io/node-id"
# How long a restart waits for Ray to confirm the old ranks are dead.
KILL_CONFIRM_S = 10.0
# How long a recovery in place waits for the surviving ranks to leave the failed world (a
# collective fails within a second of its peer's death; a hung peer is killed first).
SETTLE_S = 5.0


class WorkerGroup:
    def __init__(
        self,
        spec: JobSpec,
        layout: JobLayout,
        locations: CheckpointLocations,
        *,
        worker_actor: Any,
        callbacks: list[WorkerGroupCallback] | None = None,
    ) -> None:
        self.job_id, self.spec, self.layout, self.locations = layout.job_id, spec, layout, locations
        self.worker_actor = worker_actor  # the Ray actor class of one rank
        self.callbacks = callbacks or []
        self.world_size = spec.parallel.world_size
        self.pg: PlacementGroup | None = None
        self.actors: list[Any] = []
        self.attempt = 0  # in worker names, so a restart never waits for old names to free
        self.bundle_of_rank: list[int] = []
        self.node_of_rank: list[str] = []
        self.excluded_nodes: set[str] = set()  # bad nodes: kept out of the next placement
        self.spares = WarmSpares()
        self.warm_start = False  # whether the last start() ran on warm spares
        self.pooled_ranks = 0  # how many ranks a callback lent it (the warm pool)

    def reserve(self, timeout_s: float) -> list[str]:
        """Create the placement group and wait for it; returns each rank's node id."""
        if self.pg is None:
            selector = (
                [{NODE_ID_LABEL: f"!in({','.join(sorted(self.excluded_nodes))})"}] * self.world_size
                if self.excluded_nodes
                else None
            )
            self.pg = placement_group(
                [bundle_resources(self.spec)] * self.world_size,
                strategy="PACK",
                name=placement_group_name(self.job_id),
                bundle_label_selector=selector,
            )
        ray.get(self.pg.ready(), timeout=timeout_s)
        nodes = placement_group_table(self.pg)["bundles_to_node_id"]
        # Rank r uses bundle self.bundle_of_rank[r]: bundles sorted by node, then index.
        self.bundle_of_rank = sorted(range(self.world_size), key=lambda b: (nodes[b], b))
        self.node_of_rank = [nodes[b] for b in self.bundle_of_rank]
        for callback in self.callbacks:
            callback.after_reserve(self)
        return self.node_of_rank

    @property
    def resources(self) -> dict[str, float]:
        """What one rank's bundle reserves."""
        return bundle_resources(self.spec)

    def resize(self, spec: JobSpec) -> None:
        """Use `spec`'s layout from the next reserve() (an elastic re-plan): the placement
        group is given back and made again at the new size."""
        self.spec = spec
        self.world_size = spec.parallel.world_size
        self.drop_placement()

    def exclude_nodes(self, nodes: set[str]) -> set[str]:
        """Keep `nodes` out of the next placement (made again at the next reserve());
        returns those excluded. The cluster's last alive nodes are never all excluded:
        a job with nowhere to go would wait for ever."""
        alive = alive_nodes()
        wanted = (self.excluded_nodes | nodes) & alive
        if not nodes or not alive - wanted:
            return set()
        self.excluded_nodes = wanted
        self.drop_placement()
        return nodes & wanted

    def node_of(self, ranks: list[int]) -> list[str]:
        return [self.node_of_rank[r] for r in ranks if r < len(self.node_of_rank)]

    def lost_a_node(self) -> bool:
        """Whether a node of the last placement is dead."""
        return bool(set(self.node_of_rank) - alive_nodes())

    def has_room_for(self, spec: JobSpec) -> bool:
        """Whether the cluster's free resources (with this job's own) could hold `spec`'s
        ranks now: a cheap check before growing back."""
        free = free_outside(self.excluded_nodes)
        extra = spec.parallel.world_size - self.world_size
        return all(
            free.get(name, 0.0) + 1e-9 >= amount * extra
            for name, amount in bundle_resources(spec).items()
        )

    def drop_placement(self) -> None:
        if self.spares.drop():
            self.attempt += 1  # their names (the next attempt's) may not be free yet
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        """One actor per rank; all join the world and start training."""
        assert self.pg is not None, "reserve() first"
        self.actors = self._fresh_actors(None)
        self._join(join_timeout_s, cancelled, rejoining=set())

    def restart_in_place(
        self, lost: list[int], join_timeout_s: float, cancelled: Callable[[], bool]
    ) -> None:
        """Replace only the `lost` ranks (by warm spares where ready); the others join the
        new world in their own processes. InPlaceRefused where they cannot: the caller
        then restarts every rank."""
        survivors = [r for r in range(len(self.actors)) if r not in lost]
        if self.pg is None or len(self.actors) != self.world_size or not survivors:
            raise InPlaceRefused("the job's ranks were already taken down")
        kill_and_confirm([self.actors[r] for r in lost], KILL_CONFIRM_S, self.job_id)
        settling = [self.actors[r].settle.remote(SETTLE_S) for r in survivors]
        for rank, actor in zip(lost, self._fresh_actors(lost), strict=True):
            self.actors[rank] = actor
        try:
            ray.get(settling, timeout=SETTLE_S + KILL_CONFIRM_S)
        except Exception as err:  # still in a collective of the failed world, or gone
            cause = getattr(err, "cause", None) or err
            msg = f"a surviving rank could not leave the failed world: {cause}"
            raise InPlaceRefused(msg) from None
        self._join(join_timeout_s, cancelled, rejoining=set(survivors))

    def _fresh_actors(self, ranks: list[int] | None) -> list[Any]:
        """New actors for `ranks` (default: all): warm spares where ready, else new."""
        self.warm_start, self.pooled_ranks = False, 0  # said in the supervisor's event
        if ranks == []:  # every rank goes on in its process: the spares wait for a later use
            return []
        self.attempt += 1
        spares, thrown = self.spares.take(self._spare_key(), self.job_id, ranks)
        if thrown:
            self.attempt += 1  # the thrown spares' names may not be free yet
        self.warm_start = bool(spares)
        self.spares.attempt_started()
        return spares or self._make_actors(self.attempt, spare=False, ranks=ranks)

    def _join(
        self, join_timeout_s: float, cancelled: Callable[[], bool], rejoining: set[int]
    ) -> None:
        """Form the world and train; the ranks in `rejoining` in their old processes."""
        deadline, lost = time.monotonic() + join_timeout_s, self.lost_a_node
        try:
            refs = [self.actors[0].rendezvous_address.remote()]
            ((addr, port),) = wait_for_start(refs, deadline, cancelled, lost)
            refs = [
                (a.rejoin if rank in rejoining else a.start).remote(addr, port, join_timeout_s)
                for rank, a in enumerate(self.actors)
            ]
            wait_for_start(refs, deadline, cancelled, lost)
        except NodeLost:
            dead = sorted(set(self.node_of_rank) - alive_nodes())
            self.kill_workers()
            self.drop_placement()
            raise NodeLost(dead) from None
        log.info("job %s: %d workers started at %s:%d", self.job_id, len(self.actors), addr, port)
        for callback in self.callbacks:
            callback.after_start(self)

    def _make_actors(
        self, attempt: int, *, spare: bool, ranks: list[int] | None = None
    ) -> list[Any]:
        """An actor per rank of `ranks` (default: all) in its bundle (a spare reserves none):
        one a callback lends (the warm pool's, on the rank's node), else a new one."""
        assert self.pg is not None, "reserve() first"
        res, locations = self.resources, self.locations
        wanted = [r for r in range(self.world_size) if ranks is None or r in ranks]
        lent: dict[int, Any] = {}
        if not spare:
            for callback in self.callbacks:
                nodes = {r: self.node_of_rank[r] for r in wanted if r not in lent}
                lent.update(callback.lend(self, nodes) if nodes else {})
            self.pooled_ranks = len(lent)
        return [
            lent.get(rank)
            or self.worker_actor.options(
                name=worker_name(self.job_id, attempt, rank),
                namespace=NAMESPACE,
                num_cpus=0 if spare else res["CPU"],
                num_gpus=0 if spare else res.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=self.bundle_of_rank[rank]
                ),
            ).remote(self.layout, rank, self.world_size, self.spec, locations, res["CPU"], spare)
            for rank in wanted
        ]

    def _spare_key(self) -> tuple[Any, ...]:
        return (self.pg, tuple(self.bundle_of_rank), self.spec.model_dump_json(), self.locations)

    def make_spares(self) -> None:
        """Start the next attempt's actors now, so a restart finds them warm."""
        if self.pg is None or not warm_spares_wanted(self.spec):
            return
        self.spares.make(lambda: self._make_actors(self.attempt + 1, spare=True), self._spare_key())

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        """Every rank's status; a rank that does not answer in time is reported failed."""
        refs = [a.poll.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        statuses: list[WorkerStatus] = []
        for rank, ref in enumerate(refs):
            if ref not in done:
                why = f"did not answer a poll in {timeout_s:.0f}s (hung or stopped)"
                statuses.append(WorkerStatus.lost_rank(rank, why))
                continue
            try:
                statuses.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                why = f"its actor died: {type(err).__name__}"
                statuses.append(WorkerStatus.lost_rank(rank, why))
        for callback in self.callbacks:
            callback.after_poll(self, statuses)
        return statuses

    def kill_workers(self) -> None:
        """Kill every rank and wait (bounded) until Ray reports each one dead: a rank that
        was only stopped or wedged must not wake beside the next attempt's workers and go
        on logging metrics and writing checkpoints."""
        kill_and_confirm(self.actors, KILL_CONFIRM_S, self.job_id)
        self.actors = []

    def release(self) -> None:
        """The job is done with its ranks: the callbacks take back what they lent (the
        warm pool, those that ended cleanly), the other workers are killed, the placement
        group given back, and the callbacks clean up after them (the snapshots)."""
        for callback in self.callbacks:
            callback.before_release(self)
        self.kill_workers()
        self.drop_placement()
        for callback in self.callbacks:
            callback.after_release(self)

    # -- what the group asks of all its ranks, or of one, by a Ray call -------------------

    def inject_fault(self, rank: int, kind: str) -> None:
        """Deliver a chaos-test fault to one rank (it answers before a `kill` takes it)."""
        if not self.actors:
            raise ValueError("the job's workers are being replaced; send it once RUNNING again")
        if not 0 <= rank < len(self.actors):
            raise ValueError(f"rank {rank} is not one of the job's {len(self.actors)} ranks")
        ray.get(self.actors[rank].inject_fault.remote(kind), timeout=30)

    def profile(self, profile_id: str, steps: int) -> int:
        """Have every rank record its next `steps` steps (workers/runtime/profiling.py);
        how many ranks were asked."""
        if not self.actors:
            raise ValueError("the job's workers are being replaced; ask once RUNNING again")
        ray.get([a.profile.remote(profile_id, steps) for a in self.actors], timeout=30)
        return len(self.actors)

    def request_stop(self, save: bool = False) -> None:
        for a in self.actors:
            a.stop.remote(save)
