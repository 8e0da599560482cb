"""When warm spares are made: after every rank's first step of an attempt, never while the
group has no ranks (a pause had emptied it when a poll once crashed the supervisor)."""

from __future__ import annotations

import time

from shardline.workers.contract.status import WorkerPhase, WorkerStatus
from shardline.workers.runtime.spares import WarmSpares


def training(*steps: int) -> list[WorkerStatus]:
    return [
        WorkerStatus(rank, WorkerPhase.TRAINING, step, 1.0, time.time())
        for rank, step in enumerate(steps)
    ]


def test_spares_are_due_once_every_rank_has_stepped_since_the_start() -> None:
    spares = WarmSpares()
    assert not spares.due(training(3, 3))  # the steps the attempt started from
    assert not spares.due(training(4, 3))  # rank 1 has not stepped yet
    assert spares.due(training(4, 4))


def test_a_group_emptied_by_a_pause_or_resized_is_never_an_error() -> None:
    spares = WarmSpares()
    assert not spares.due(training(3, 3))
    assert not spares.due([])  # the ranks were released (a pause): no spares, no error
    assert not spares.due(training(5))  # fewer ranks than at the start: start again
    assert spares.due(training(6))
