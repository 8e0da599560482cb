"""Bad nodes: a node on which ranks of a job hung or died twice is left out of the job's
next placement (decisions here; the worker group makes the placement)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

from shardline.workers.contract.events import Event, EventKind

STRIKES_TO_EXCLUDE = 2


class NodeHealth:
    def __init__(self, strikes: int = STRIKES_TO_EXCLUDE) -> None:
        self.strikes = strikes
        self.failures: Counter[str] = Counter()
        self.bad: set[str] = set()

    def record(self, nodes: list[str]) -> list[str]:
        """Count one failure on each of `nodes` (those of the ranks that hung or died);
        returns the nodes that became bad with it."""
        newly = []
        for node in sorted(set(nodes)):
            self.failures[node] += 1
            if self.failures[node] >= self.strikes and node not in self.bad:
                self.bad.add(node)
                newly.append(node)
        return newly

    def leave_out(
        self, workers: object, ranks: list[int], on_event: Callable[[Event], Any]
    ) -> list[str]:
        """Count a failure on the nodes of `ranks` (those that hung or died); a node at
        its second is left out of the job's next placement, said through `on_event`.
        Returns the nodes left out now (the placement is then made again)."""
        if not ranks or not isinstance(workers, PlacedWorkers):
            return []
        left_out = []
        for node in self.record(workers.node_of(ranks)):
            if workers.exclude_nodes({node}):
                left_out.append(node)
                on_event(
                    Event(
                        EventKind.NODE,
                        f"node {node} left out of this job's next placement: its ranks hung "
                        f"or died {self.failures[node]} times",
                        {"node": node},
                    )
                )
            else:
                on_event(
                    Event(
                        EventKind.NODE,
                        f"node {node} is failing but is the only one left: kept",
                        {"node": node},
                    )
                )
        return left_out


@runtime_checkable
class PlacedWorkers(Protocol):
    """A worker group that knows where its ranks run and can avoid nodes."""

    def node_of(self, ranks: list[int]) -> list[str]: ...
    def exclude_nodes(self, nodes: set[str]) -> set[str]: ...


def alive_nodes() -> set[str]:
    """The IDs of the cluster's live nodes (a dead node's ID never comes back)."""
    import ray

    return {n["NodeID"] for n in ray.nodes() if n["Alive"]}


def free_outside(nodes: set[str]) -> dict[str, float]:
    """The cluster's free resources less what `nodes` have free: room a job that leaves
    them out (bad, or being preempted) could use."""
    import ray

    free = ray.available_resources()
    if nodes:
        per_node = ray._private.state.available_resources_per_node()
        for node in nodes:
            for name, amount in per_node.get(node, {}).items():
                free[name] = free.get(name, 0.0) - amount
    return free
