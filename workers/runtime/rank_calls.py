"""What a worker group asks of all its ranks, or of one, by a Ray call: chaos-test faults,
profiles and stops (the Workers protocol's, beside the group's starts and polls)."""

from __future__ import annotations

from typing import Any

import ray


class RankCalls:
    actors: list[Any]  # the ranks' actors, by rank (empty while they are replaced)

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
