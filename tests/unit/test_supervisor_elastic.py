"""The supervisor's bad-node and grow-back decisions, against a fake worker group that
knows its nodes and can be resized."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import EventEntry
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerStatus
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.storage.layout import JobLayout
from tests.unit.test_supervisor import FakeWorkers, no_waiting, status

__all__ = ["no_waiting"]  # the autouse fixture: no poll interval, no backoff


class PlacedFakeWorkers(FakeWorkers):
    """Rank r runs on nodes[r]; remembers exclusions and resizes."""

    def __init__(self, polls: list[list[WorkerStatus]], nodes: list[str]) -> None:
        super().__init__(polls)
        self.nodes = nodes
        self.excluded: set[str] = set()
        self.sizes: list[int] = []
        self.room = True

    def node_of(self, ranks: list[int]) -> list[str]:
        return [self.nodes[r] for r in ranks]

    def exclude_nodes(self, nodes: set[str]) -> set[str]:
        self.excluded |= nodes
        return nodes

    def resize(self, spec: JobSpec) -> None:
        self.sizes.append(spec.parallel.dp)

    def has_room_for(self, spec: JobSpec) -> bool:
        return self.room

    def lost_a_node(self) -> bool:
        return False


def lost(rank: int) -> WorkerStatus:
    return replace(status(rank, "failed", 0, error="its actor died"), lost=True)


def make(tmp_path: Path, workers: FakeWorkers, **ft: Any) -> JobSupervisor:
    spec = JobSpec.model_validate(
        {"name": "s", "parallel": {"dp": 2}, "fault_tolerance": {"max_failures": 3, **ft}}
    )
    return JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)


def events(sup: JobSupervisor) -> list[str]:
    return [e.message for e in sup.buffer.after(0) if isinstance(e, EventEntry)]


def test_a_node_where_ranks_died_twice_is_left_out_and_named(tmp_path: Path) -> None:
    # Rank 1 (node-b) dies twice; rank 0 (node-a) only saw its peer die: not its node's fault.
    peer_error = status(0, "failed", 3, error="gloo: connection closed by peer")
    workers = PlacedFakeWorkers(
        [
            [peer_error, lost(1)],
            [peer_error, lost(1)],
            [status(0, "done", 4), status(1, "done", 4)],
        ],
        nodes=["node-a", "node-b"],
    )
    sup = make(tmp_path, workers)
    assert sup.run() == JobState.SUCCEEDED
    assert workers.excluded == {"node-b"}
    said = [e for e in events(sup) if e.startswith("node ")]
    assert said == [
        "node node-b left out of this job's next placement: its ranks hung or died 2 times"
    ]


def test_a_shrunk_elastic_job_grows_back_when_there_is_room(
    tmp_path: Path, monkeypatch: Any
) -> None:
    workers = PlacedFakeWorkers(
        [
            [status(0, "training", 3)],  # running shrunk at dp=1
            [status(0, "stopped", 4)],  # stopped with a checkpoint to grow
            [status(0, "done", 6), status(1, "done", 6)],
        ],
        nodes=["node-a", "node-a"],
    )
    sup = make(tmp_path, workers, elastic={"min_dp": 1})
    sup.grow.check_every_s = 0.0
    sup.running = JobSpec.model_validate({**sup.spec.model_dump(), "parallel": {"dp": 1}})
    assert sup.run() == JobState.SUCCEEDED
    assert workers.sizes == [2] and sup.running.parallel.dp == 2
    assert "stop" in workers.log
    assert any(
        e.startswith(
            "elastic: capacity is back, growing from dp=1 tp=1 pp=1 (1 rank) to dp=2 tp=1 pp=1"
        )
        for e in events(sup)
    )


def test_a_shrunk_job_grows_back_only_after_training_past_its_restore(tmp_path: Path) -> None:
    workers = PlacedFakeWorkers(
        [
            [status(0, "training", 6)],  # started again at step 6: not past the restore yet
            [status(0, "training", 7)],  # trained past it: the recovery closes, it may grow
            [status(0, "stopped", 7)],
            [status(0, "done", 10), status(1, "done", 10)],
        ],
        nodes=["node-a", "node-a"],
    )
    sup = make(tmp_path, workers, elastic={"min_dp": 1})
    sup.grow.check_every_s = 0.0
    sup.running = JobSpec.model_validate({**sup.spec.model_dump(), "parallel": {"dp": 1}})
    sup.recoveries.open("node lost", [1], front_step=9).restored_step = 6
    stopped_after: list[int] = []
    workers.request_stop = lambda save=False: stopped_after.append(len(workers.polls_at))  # type: ignore[method-assign]
    assert sup.run() == JobState.SUCCEEDED
    assert stopped_after == [2]  # not at the first poll, which had not trained past step 6
    said = events(sup)
    recovered = next(i for i, e in enumerate(said) if e.startswith("recovered in"))
    grown = next(i for i, e in enumerate(said) if e.startswith("elastic: capacity is back"))
    assert recovered < grown, said
