"""The ranks of one job: a placement group with one bundle per rank, one actor per bundle.

Ranks are ordered by node so that neighbouring ranks (a tensor-parallel group, tp being the
fastest-varying mesh dim) share a node.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import ray
from ray.util.placement_group import (
    PlacementGroup,
    placement_group,
    placement_group_table,
    remove_placement_group,
)
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from workers.spec import JobSpec
from workers.storage import JobStorage
from workers.worker import CheckpointTargets, WorkerPhase

log = logging.getLogger(__name__)


def bundle_resources(spec: JobSpec) -> dict[str, float]:
    """What one rank reserves."""
    res = {"CPU": spec.resources.cpus_per_worker}
    if spec.resources.gpus_per_worker > 0:
        res["GPU"] = spec.resources.gpus_per_worker
    return res


def placement_group_name(job_id: str) -> str:
    return f"shardline-job-{job_id}"


def dead_status(rank: int, error: str) -> dict[str, Any]:
    return {
        "rank": rank,
        "phase": WorkerPhase.FAILED,
        "step": 0,
        "loss": None,
        "last_progress": time.time(),
        "error": error,
        "deterministic": False,
        "metrics": [],
        "events": [],
        "checkpoints": [],
        "summary": None,
    }


class WorkerGroup:
    def __init__(
        self, job_id: str, spec: JobSpec, storage: JobStorage, checkpoints: CheckpointTargets
    ) -> None:
        self.job_id = job_id
        self.spec = spec
        self.storage = storage
        self.checkpoints = checkpoints
        self.world_size = spec.parallel.world_size
        self.pg: PlacementGroup | None = None
        self.actors: list[Any] = []
        self.attempt = 0  # in worker names, so a restart never waits for old names to free

    def reserve(self, timeout_s: float) -> list[str]:
        """Create the placement group and wait for it; returns each rank's node id."""
        if self.pg is None:
            self.pg = placement_group(
                [bundle_resources(self.spec)] * self.world_size,
                strategy="PACK",
                name=placement_group_name(self.job_id),
            )
        ray.get(self.pg.ready(), timeout=timeout_s)
        nodes = placement_group_table(self.pg)["bundles_to_node_id"]
        # Rank r uses bundle self.bundle_of_rank[r]: bundles sorted by node, then index.
        self.bundle_of_rank = sorted(range(self.world_size), key=lambda b: (nodes[b], b))
        return [nodes[b] for b in self.bundle_of_rank]

    def start(self, join_timeout_s: float) -> None:
        """One actor per rank; all join the world and start training."""
        from workers.actors import NAMESPACE, WorkerActor, worker_name

        assert self.pg is not None, "reserve() first"
        res = bundle_resources(self.spec)
        spec_json = self.spec.model_dump_json()
        self.attempt += 1
        self.actors = [
            WorkerActor.options(
                name=worker_name(self.job_id, self.attempt, rank),
                namespace=NAMESPACE,
                num_cpus=res["CPU"],
                num_gpus=res.get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pg, placement_group_bundle_index=bundle
                ),
            ).remote(
                self.job_id,
                rank,
                self.world_size,
                spec_json,
                str(self.storage.log_file(rank)),
                res["CPU"],
                self.checkpoints,
                str(self.storage.metrics_file) if rank == 0 else None,
            )
            for rank, bundle in enumerate(self.bundle_of_rank)
        ]
        addr, port = ray.get(self.actors[0].rendezvous_address.remote(), timeout=join_timeout_s)
        ray.get(
            [a.start.remote(addr, port, join_timeout_s) for a in self.actors],
            timeout=join_timeout_s,
        )
        log.info(
            "job %s: %d workers started, rendezvous %s:%d",
            self.job_id,
            len(self.actors),
            addr,
            port,
        )

    def poll(self, timeout_s: float) -> list[dict[str, Any]]:
        """Every rank's status; a rank that does not answer in time is reported failed."""
        refs = [a.poll.remote() for a in self.actors]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        done = set(ready)
        statuses = []
        for rank, ref in enumerate(refs):
            if ref not in done:
                statuses.append(
                    dead_status(
                        rank, f"did not answer a poll in {timeout_s:.0f}s (hung or stopped)"
                    )
                )
                continue
            try:
                statuses.append(ray.get(ref))
            except ray.exceptions.RayActorError as err:
                statuses.append(dead_status(rank, f"its actor died: {type(err).__name__}"))
        return statuses

    def inject_fault(self, rank: int, kind: str) -> None:
        """Deliver a chaos-test fault to one rank (it answers before a `kill` takes it)."""
        if not 0 <= rank < len(self.actors):
            raise ValueError(f"rank {rank} is not one of the job's {len(self.actors)} ranks")
        ray.get(self.actors[rank].inject_fault.remote(kind), timeout=30)

    def request_stop(self, save: bool = False) -> None:
        for a in self.actors:
            a.stop.remote(save)

    def kill_workers(self) -> None:
        for a in self.actors:
            ray.kill(a, no_restart=True)
        self.actors = []

    def release(self) -> None:
        """Kill the workers and give the placement group back."""
        self.kill_workers()
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None
