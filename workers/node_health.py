"""Bad nodes: a node on which ranks of a job hung or died twice is left out of the job's
next placement (decisions here; the worker group makes the placement)."""

from __future__ import annotations

from collections import Counter
from typing import Protocol, runtime_checkable

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


@runtime_checkable
class PlacedWorkers(Protocol):
    """A worker group that knows where its ranks run and can avoid nodes."""

    def node_of(self, ranks: list[int]) -> list[str]: ...
    def exclude_nodes(self, nodes: set[str]) -> set[str]: ...
