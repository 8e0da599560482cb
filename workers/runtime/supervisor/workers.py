"""What the supervisor needs of its worker group (the `Workers` protocol: the Ray group in
production, a fake in unit tests) and where that group's checkpoints go."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from shardline.workers.contract.demand import snapshots_wanted
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerStatus
from shardline.workers.storage.checkpoints import RestoreSource
from shardline.workers.storage.layout import CheckpointLocations, JobLayout


class FaultRefused(RuntimeError):
    """A fault or a profile cannot be taken now (the job is not running): the API's 409."""


class StartCancelled(Exception):
    """A cancel came while the workers were starting: they are left to release()."""


class NodeLost(Exception):
    """A node of the placement died while the workers started (a restart onto a node Ray
    had not yet declared dead): they are killed and the placement dropped, so the next
    start reserves again without it, and it is no failure of the job."""

    def __init__(self, nodes: list[str]) -> None:
        named = ", ".join(n[:8] for n in nodes) or "?"
        super().__init__(f"node(s) {named} of the placement died while the workers started")
        self.nodes = nodes


class InPlaceRefused(RuntimeError):
    """A recovery in place cannot go on (a surviving rank is still in the failed world's
    collectives, the ranks were taken down): every rank is restarted instead."""


class Workers(Protocol):
    def reserve(self, timeout_s: float) -> list[str]: ...
    # Waits for the world to join in short slices, raising StartCancelled once
    # `cancelled()` says so: a cancel must not wait out the join timeout.
    def start(self, join_timeout_s: float, cancelled: Callable[[], bool]) -> None: ...
    def poll(self, timeout_s: float) -> list[WorkerStatus]: ...
    def request_stop(self, save: bool = False) -> None: ...
    def kill_workers(self) -> None: ...
    def release(self) -> None: ...
    def inject_fault(self, rank: int, kind: str) -> None: ...
    def profile(self, profile_id: str, steps: int) -> int: ...  # the ranks asked

    # Whether the last start() ran on warm spares (said in the "workers started" event).
    @property
    def warm_start(self) -> bool: ...

    # How many ranks the last start() took from the warm pool (said in that event too).
    @property
    def pooled_ranks(self) -> int: ...


@runtime_checkable
class InPlaceWorkers(Protocol):
    """A worker group that can replace some ranks while the others keep their processes."""

    # Kills the `lost` ranks, replaces them, and has every rank join a new world and train
    # from the newest checkpoint; raises InPlaceRefused (or anything) where it cannot.
    def restart_in_place(
        self, lost: list[int], join_timeout_s: float, cancelled: Callable[[], bool]
    ) -> None: ...


# Makes a job's worker group (injected: the supervisor imports no actor).
WorkersFactory = Callable[[JobSpec, JobLayout, CheckpointLocations], Workers]


def checkpoint_locations(spec: JobSpec, layout: JobLayout) -> CheckpointLocations:
    """The job saves into its own folder and starts from it; a job with `resume_from`
    starts from that job's checkpoint until it has one of its own."""
    source = spec.resume_from
    resume = (
        RestoreSource(layout.of_job(source.job_id).checkpoints_dir, step=source.step)
        if source is not None
        else None
    )
    return layout.checkpoint_locations(resume_from=resume, snapshots=snapshots_wanted(spec))
