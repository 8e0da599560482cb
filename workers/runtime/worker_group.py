"""The ranks of one job: a placement group with one bundle per rank, one actor per bundle.

Ranks are ordered by node so that neighbouring ranks (a tensor-parallel group, tp being the
fastest-varying mesh dim) share a node. The worker actor class is handed in (see
workers/runtime/actors.py), so this module imports no actor and no supervisor.
"""

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
from ray.util.scheduling_strategies import (
    NodeAffinitySchedulingStrategy,
    PlacementGroupSchedulingStrategy,
)

from workers.contract.demand import bundle_resources, warm_spares_wanted
from workers.contract.spec import JobSpec
from workers.contract.status import WorkerStatus
from workers.runtime.joining import wait_for_start
from workers.runtime.names import NAMESPACE, placement_group_name, worker_name
from workers.runtime.placement.node_health import alive_nodes, free_outside
from workers.runtime.spares import WarmSpares, kill_actors
from workers.runtime.supervisor.workers import NodeLost
from workers.storage.layout import CheckpointLocations, JobLayout
from workers.storage.snapshots import remove_snapshot_dir

log = logging.getLogger(__name__)

# Ray labels every node with its id; a placement group can be kept off some nodes by it.
NODE_ID_LABEL = "ray.io/node-id"
CLEANUP_TIMEOUT_S = 30.0
# How long a restart waits for Ray to confirm the old ranks are dead.
KILL_CONFIRM_S = 10.0


class WorkerGroup:
    def __init__(
        self,
        spec: JobSpec,
        layout: JobLayout,
        locations: CheckpointLocations,
        *,
        worker_actor: Any,
    ) -> None:
        self.job_id = layout.job_id
        self.spec = spec
        self.layout = layout
        self.locations = locations
        self.worker_actor = worker_actor  # the Ray actor class of one rank
        self.world_size = spec.parallel.world_size
        self.pg: PlacementGroup | None = None
        self.actors: list[Any] = []
        self.attempt = 0  # in worker names, so a restart never waits for old names to free
        self.bundle_of_rank: list[int] = []
        self.node_of_rank: list[str] = []
        self.excluded_nodes: set[str] = set()  # bad nodes: kept out of the next placement
        self._snapshot_nodes: set[str] = set()  # nodes that may hold this job's snapshots
        self.spares = WarmSpares()
        self.warm_start = False  # whether the last start() ran on warm spares

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
        return self.node_of_rank

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

    def _locations(self) -> CheckpointLocations:
        """Where the ranks save and restore; notes the nodes that will hold snapshots (each
        rank writes into its own node's host memory: workers/engine/checkpoint/spread.py)."""
        if self.locations.snapshot_url is not None:
            self._snapshot_nodes |= set(self.node_of_rank)
        return self.locations

    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None:
        """One actor per rank; all join the world and start training."""
        assert self.pg is not None, "reserve() first"
        locations = self._locations()
        self.attempt += 1
        spares, thrown = self.spares.take(self._spare_key(locations), self.job_id)
        if thrown:
            self.attempt += 1
        self.actors = spares or self._make_actors(self.attempt, locations, spare=False)
        self.warm_start = bool(spares)  # said in the supervisor's event
        self.spares.attempt_started()
        deadline, lost = time.monotonic() + join_timeout_s, self.lost_a_node
        try:
            refs = [self.actors[0].rendezvous_address.remote()]
            ((addr, port),) = wait_for_start(refs, deadline, cancelled, lost)
            refs = [a.start.remote(addr, port, join_timeout_s) for a in self.actors]
            wait_for_start(refs, deadline, cancelled, lost)
        except NodeLost:
            dead = sorted(set(self.node_of_rank) - alive_nodes())
            self.kill_workers()
            self.drop_placement()
            raise NodeLost(dead) from None
        log.info("job %s: %d workers started at %s:%d", self.job_id, len(self.actors), addr, port)

    def _make_actors(
        self, attempt: int, locations: CheckpointLocations, *, spare: bool
    ) -> list[Any]:
        """One actor per rank in its bundle; a spare reserves none of the bundle."""
        assert self.pg is not None, "reserve() first"
        res = bundle_resources(self.spec)
        spec_json = self.spec.model_dump_json()
        return [
            self.worker_actor.options(
                name=worker_name(self.job_id, attempt, rank),
                namespace=NAMESPACE,
                num_cpus=0 if spare else res["CPU"],
                num_gpus=0 if spare else res.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=bundle
                ),
            ).remote(self.layout, rank, self.world_size, spec_json, locations, res["CPU"], spare)
            for rank, bundle in enumerate(self.bundle_of_rank)
        ]

    def _spare_key(self, locations: CheckpointLocations) -> tuple[Any, ...]:
        return (self.pg, tuple(self.bundle_of_rank), self.spec.model_dump_json(), locations)

    def make_spares(self) -> None:
        """Start the next attempt's actors now, so a restart finds them warm."""
        if self.pg is None or not warm_spares_wanted(self.spec):
            return
        locations = self._locations()
        self.spares.make(
            lambda: self._make_actors(self.attempt + 1, locations, spare=True),
            self._spare_key(locations),
        )

    def poll(self, timeout_s: float) -> list[WorkerStatus]:
        """Every rank's status; a rank that does not answer in time is reported failed."""
        refs = [a.poll.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        statuses: list[WorkerStatus] = []
        for rank, ref in enumerate(refs):
            if ref not in done:
                statuses.append(
                    WorkerStatus.lost_rank(
                        rank, f"did not answer a poll in {timeout_s:.0f}s (hung or stopped)"
                    )
                )
                continue
            try:
                statuses.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                statuses.append(
                    WorkerStatus.lost_rank(rank, f"its actor died: {type(err).__name__}")
                )
        if self.spares.due(statuses):
            self.make_spares()
        return statuses

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

    def kill_workers(self) -> None:
        """Kill every rank and wait (bounded) until Ray reports each one dead: a rank that
        was only stopped or wedged must not wake beside the next attempt's workers and go
        on logging metrics and writing checkpoints."""
        kill_actors(self.actors)
        deadline = time.monotonic() + KILL_CONFIRM_S
        alive = list(self.actors)
        while alive and time.monotonic() < deadline:
            alive = [a for a in alive if _answers(a, deadline - time.monotonic())]
            if alive:
                time.sleep(0.1)
        if alive:
            log.warning("job %s: %d killed rank(s) not yet seen dead", self.job_id, len(alive))
        self.actors = []

    def release(self) -> None:
        """Kill the workers, give the placement group back, remove the snapshots."""
        self.kill_workers()
        self.drop_placement()
        self.remove_snapshots()

    def remove_snapshots(self) -> None:
        """Delete the job's in-memory snapshots on every node that may hold them."""
        alive = alive_nodes()
        remove = ray.remote(num_cpus=0)(_remove_snapshots_here)
        refs = [
            remove.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
            ).remote(self.layout)
            for node in self._snapshot_nodes & alive
        ]
        try:
            ray.get(refs, timeout=CLEANUP_TIMEOUT_S)
        except Exception as err:  # never let cleanup keep a job from ending
            log.warning("job %s: removing snapshots failed: %s", self.job_id, err)
        self._snapshot_nodes.clear()


def _remove_snapshots_here(layout: JobLayout) -> bool:
    """On one node: remove the job's snapshots there (its snapshot folder is that node's)."""
    return remove_snapshot_dir(layout.snapshot_dir)


def _answers(actor: Any, timeout_s: float) -> bool:
    """Whether `actor` still answers (or cannot be judged within `timeout_s`)."""
    try:
        ray.get(actor.__ray_ready__.remote(), timeout=max(timeout_s, 0.1))
    except ray.exceptions.RayActorError:
        return False
    except ray.exceptions.GetTimeoutError:
        return True
    return True
