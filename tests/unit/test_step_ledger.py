"""The step ledger on one process: when the next vote is, and the first bad step kept."""

from __future__ import annotations

import math

import pytest
import torch

from shardline.workers.engine import step_outcome
from shardline.workers.engine.nonfinite import NonFiniteLoss
from shardline.workers.engine.step_outcome import MAX_EVERY, StepLedger, StopVote

CPU = torch.device("cpu")


def _loss(value: float) -> torch.Tensor:
    return torch.tensor(value)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("step_s", "every"),
    [(0.06, 8), (0.2, 2), (0.5, 1), (3.0, 1), (0.001, MAX_EVERY)],
)
def test_votes_come_about_every_half_second_of_steps(
    monkeypatch: pytest.MonkeyPatch, step_s: float, every: int
) -> None:
    clock = Clock()
    monkeypatch.setattr(step_outcome.time, "perf_counter", clock)
    ledger = StepLedger(CPU, StopVote(), loss_copies=1)
    ledger.start_at(10)
    assert [s for s in range(1, 13) if ledger.due(s)] == [11, 12]  # the first step votes
    ledger.settle(11, _loss(2.0), batch_of=lambda s: s)
    assert ledger.next_vote == 12  # nothing timed yet: the next step votes too
    clock.now += step_s
    ledger.settle(12, _loss(2.0), batch_of=lambda s: s)
    assert ledger.every == every and ledger.next_vote == 12 + every
    assert [s for s in range(13, 13 + every) if ledger.due(s)] == [12 + every]


def test_a_known_stop_step_votes_off_the_cadence() -> None:
    vote = StopVote(stop_after=17)
    ledger = StepLedger(CPU, vote, loss_copies=1)
    ledger.next_vote = 50
    assert [s for s in range(12, 30) if ledger.due(s)] == [17]
    assert ledger.settle(17, _loss(3.0), batch_of=lambda s: s) == 3.0
    assert vote.stop and vote.save


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_the_first_non_finite_step_is_named_at_the_next_vote(bad: float) -> None:
    ledger = StepLedger(CPU, StopVote(), loss_copies=2)
    for step, value in [(1, 2.0), (2, bad), (3, math.nan), (4, 1.5)]:
        ledger.note(step, _loss(value))
    with pytest.raises(NonFiniteLoss) as raised:
        ledger.settle(4, _loss(1.5), batch_of=lambda s: s + 100)
    err = raised.value
    assert (err.step, err.batch) == (2, 102)
    assert math.isnan(err.loss) if math.isnan(bad) else err.loss == bad


def test_finite_steps_settle_to_the_world_mean() -> None:
    ledger = StepLedger(CPU, StopVote(), loss_copies=2)
    for step in range(1, 4):
        ledger.note(step, _loss(4.0))
    assert ledger.settle(3, _loss(4.0), batch_of=lambda s: s) == 2.0  # one process: 4 / 2


def test_a_new_run_keeps_nothing_of_an_earlier_one() -> None:
    """A non-finite loss noted before a run (a step trained by hand, then `train()`) is
    not raised in the new run, and its cadence starts again at every step."""
    ledger = StepLedger(CPU, StopVote(), loss_copies=1)
    ledger.note(3, _loss(math.nan))
    ledger.every = 40
    ledger.start_at(3)
    assert ledger.every == 1 and ledger.due(4)
    assert ledger.settle(4, _loss(2.0), batch_of=lambda s: s) == 2.0
