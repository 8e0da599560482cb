"""Recovery in place, through the `Workers` protocol with a fake group: a lost rank is
replaced alone while the others keep their processes; every rank restarts where in place
is off, impossible or fails, and the recovery event says which and why."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.supervisor.machine import JobSupervisor
from shardline.workers.runtime.supervisor.workers import InPlaceRefused
from shardline.workers.storage.layout import JobLayout
from tests.unit.test_supervisor_recovery import (
    PlacedScriptedWorkers,
    events,
    make,
    nonfinite,
    quick_polls,  # noqa: F401  (the fixture, autouse there, is used here too)
    states,
    status,
    training,
)


class InPlaceScriptedWorkers(PlacedScriptedWorkers):
    """Also replaces ranks in place (playing the next script), or refuses with `refuse`."""

    def __init__(
        self, scripts: list[list[list[WorkerStatus]]], nodes: list[str], refuse: str = ""
    ) -> None:
        super().__init__(scripts, nodes)
        self.refuse = refuse

    def restart_in_place(
        self, lost: list[int], join_timeout_s: float, cancelled: Callable[[], bool]
    ) -> None:
        self.calls.append(f"in place {lost}")
        if self.refuse:
            raise InPlaceRefused(self.refuse)
        self.script = list(self.scripts.pop(0))


# One try in place, then every rank killed and started again.
IN_PLACE_THEN_EVERY_RANK = [
    "reserve",
    "start",
    "in place [1]",
    "kill",
    "reserve",
    "start",
    "release",
]


def lost_rank() -> list[WorkerStatus]:
    return [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 3, lost=True)]


def one_raised() -> list[WorkerStatus]:
    # Rank 0 still waits in the collective rank 1 left: rank 1's process must go too.
    return [status(0, WorkerPhase.TRAINING, 4), status(1, WorkerPhase.FAILED, 4, error="y")]


def raised() -> list[WorkerStatus]:
    return [
        status(0, WorkerPhase.FAILED, 4, error="x"),
        status(1, WorkerPhase.FAILED, 4, error="y"),
    ]


def done() -> list[WorkerStatus]:
    return [status(0, WorkerPhase.DONE, 8), status(1, WorkerPhase.DONE, 8)]


def recovery(sup: Any) -> dict[str, Any]:
    data: dict[str, Any] = next(e for e in events(sup) if e.message.startswith("recovered")).data
    return data


@pytest.mark.parametrize(
    ("first", "replaced"),
    [(lost_rank, [1]), (one_raised, [1]), (raised, [])],
    ids=["killed", "raised-beside-a-waiting-peer", "all-raised"],
)
def test_a_failure_on_a_live_node_replaces_only_the_lost_ranks(
    tmp_path: Path, first: Callable[[], list[WorkerStatus]], replaced: list[int]
) -> None:
    workers = InPlaceScriptedWorkers([[first()], [training(), done()]], ["node-a", "node-a"])
    sup = make(tmp_path, workers, max_failures=1)
    assert sup.run() == JobState.SUCCEEDED
    # No kill of every rank, no new placement: the lost ones alone are replaced.
    assert workers.calls == ["reserve", "start", f"in place {replaced}", "release"]
    assert states(sup) == ["RUNNING", "RESTARTING", "RUNNING", "SUCCEEDED"]
    rec = recovery(sup)
    assert rec["in_place"] is True and rec["replaced"] == replaced, rec
    assert rec["why_not_in_place"] is None
    said = next(e for e in events(sup) if e.message.startswith("recovered")).message
    assert f"in place (rank(s) {replaced} replaced" in said
    assert any(e.message == "workers restarted in place" for e in events(sup))


def test_a_nonfinite_loss_rolls_back_in_place(tmp_path: Path) -> None:
    bad = [nonfinite(0, 6, 6), nonfinite(1, 6, 6)]
    workers = InPlaceScriptedWorkers([[bad], [training(), done()]], ["node-a", "node-b"])
    sup = make(tmp_path, workers, max_failures=0, max_nonfinite_skips=2)
    assert sup.run() == JobState.SUCCEEDED
    assert workers.calls == ["reserve", "start", "in place []", "release"]
    assert recovery(sup)["in_place"] is True


def test_a_refused_recovery_in_place_restarts_every_rank_and_says_why(tmp_path: Path) -> None:
    workers = InPlaceScriptedWorkers(
        [[lost_rank()], [training(), done()]],
        ["node-a", "node-a"],
        refuse="rank 0 is still in the failed world's collectives",
    )
    sup = make(tmp_path, workers, max_failures=1)
    assert sup.run() == JobState.SUCCEEDED
    assert workers.calls == IN_PLACE_THEN_EVERY_RANK
    rec = recovery(sup)
    assert rec["in_place"] is False and rec["replaced"] == []
    assert rec["why_not_in_place"] == (
        "tried in place, but rank 0 is still in the failed world's collectives"
    )
    said = next(e for e in events(sup) if e.message.startswith("recovered")).message
    assert "restarting every rank (tried in place, but rank 0 is still" in said


@pytest.mark.parametrize(
    ("nodes", "ft", "why"),
    [
        (
            ["node-a", "node-a"],
            {"recover_in_place": False},
            "fault_tolerance.recover_in_place is off",
        ),
        (["node-a", "node-b"], {}, "a node of the job may be lost"),
    ],
    ids=["turned-off", "node-suspect"],
)
def test_every_rank_restarts_where_in_place_is_off_or_a_node_may_be_lost(
    tmp_path: Path, nodes: list[str], ft: dict[str, Any], why: str
) -> None:
    workers = InPlaceScriptedWorkers([[lost_rank()], [training(), done()]], nodes)
    sup = make(tmp_path, workers, max_failures=1, **ft)
    sup.handling.policy.base_backoff_s = 0.0
    assert sup.run() == JobState.SUCCEEDED
    assert workers.calls == ["reserve", "start", "kill", "reserve", "start", "release"]
    rec = recovery(sup)
    assert rec["in_place"] is False and why in rec["why_not_in_place"], rec


def test_a_gpu_job_restarts_every_rank(tmp_path: Path) -> None:
    # An NCCL collective waits for a dead peer until its timeout: no survivor could settle.
    workers = InPlaceScriptedWorkers([[lost_rank()], [training(), done()]], ["node-a", "node-a"])
    body = {"name": "s", "parallel": {"dp": 2}, "resources": {"gpus_per_worker": 1}}
    spec = JobSpec.model_validate({**body, "fault_tolerance": {"max_failures": 1}})
    sup = JobSupervisor(JobLayout(str(tmp_path), "job1"), spec, workers=workers)
    assert sup.run() == JobState.SUCCEEDED
    assert "in place [1]" not in workers.calls
    assert "NCCL" in recovery(sup)["why_not_in_place"]


def test_a_failure_before_an_in_place_world_trained_restarts_every_rank(tmp_path: Path) -> None:
    # The world made in place fails again before its first step: a crash loop that a new
    # process might end, so the second recovery restarts every rank.
    again = [status(0, WorkerPhase.JOINING, 0), status(1, WorkerPhase.FAILED, 0, lost=True)]
    workers = InPlaceScriptedWorkers(
        [[lost_rank()], [again], [training(), done()]], ["node-a", "node-a"]
    )
    sup = make(tmp_path, workers, max_failures=2)
    sup.handling.policy.base_backoff_s = 0.0
    assert sup.run() == JobState.SUCCEEDED
    assert workers.calls == IN_PLACE_THEN_EVERY_RANK
    rec = recovery(sup)
    assert rec["in_place"] is False
    assert rec["why_not_in_place"] == "the last recovery in place trained no step"
