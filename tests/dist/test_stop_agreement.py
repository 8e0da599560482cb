"""A stop request reaches the ranks at different steps; they still stop after one step.

A pause reaches each rank by its own Ray call, so one rank can see it a step before
another. Here rank 1 hears of it a step after rank 0, and only rank 0 is asked to save:
both must stop after the same step and both take part in one checkpoint of it (before
the stop was agreed, rank 0 left the loop and waited in the checkpoint while rank 1 waited
in its next step's all-reduce, for ever).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from shardline.workers.engine import step_outcome
from shardline.workers.engine.nonfinite import NonFiniteLoss
from shardline.workers.engine.step_outcome import StepLedger
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.storage.layout import CheckpointLocations

ASKED_AT = {0: 3, 1: 4}  # the step after which each rank first sees the request


def _train_until_asked(
    folder: str, train: dict[str, int], rank: int, world_size: int, device: torch.device
) -> int:
    spec = tiny_spec(parallel={"dp": 2}, train=train)
    trainer = Trainer(
        spec,
        world_size=world_size,
        device=device,
        checkpoints=CheckpointLocations(save_url=folder),
    )
    trainer.train(lambda step: step >= ASKED_AT[rank], save_on_stop=lambda: rank == 0)
    return trainer.step


def test_ranks_asked_to_stop_at_different_steps_stop_and_save_together(tmp_path: Path) -> None:
    asked = functools.partial(_train_until_asked, str(tmp_path), {"steps": 20})
    steps = on_ranks(asked, 2, timeout_s=120)
    assert steps == [3, 3]
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [3]


def _votes_counted(every: int) -> list[int]:
    """Rank 0 proposes `every` steps between votes once it has timed a step (the cadence
    fixed, whatever this machine's speed); returns the list the steps that vote go into."""
    step_outcome.STOP_WITHIN_S = 1e9
    step_outcome.MAX_EVERY = every
    voted: list[int] = []
    settle = StepLedger.settle

    def counted(self: StepLedger, step: int, *args: Any) -> float:
        voted.append(step)
        return settle(self, step, *args)

    StepLedger.settle = counted  # type: ignore[method-assign,assignment]  # this rank's process
    return voted


def _stop_between_votes(folder: str, rank: int, world_size: int, device: torch.device) -> Any:
    voted = _votes_counted(every=10)
    train = {"steps": 200, "log_every": 1000}
    return _train_until_asked(folder, train, rank, world_size, device), voted


def test_between_votes_a_stop_waits_for_the_next_one_and_every_rank_takes_it(
    tmp_path: Path,
) -> None:
    """No collective on the steps between votes: the request seen after steps 3 and 4
    is agreed at the vote after step 12 (steps 1 and 2 vote while rank 0 times them)."""
    ranks = on_ranks(functools.partial(_stop_between_votes, str(tmp_path)), 2, timeout_s=120)
    assert ranks == [(12, [1, 2, 12])] * 2
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [12]


POISONED_AT = 4  # after this step's backward, rank 1 alone: its step 5 loss is NaN


def _poison_rank_1(step: int, modules: Any) -> None:
    if step == POISONED_AT and torch.distributed.get_rank() == 1:
        with torch.no_grad():
            next(modules[0].parameters()).fill_(float("nan"))


def _nonfinite_between_votes(rank: int, world_size: int, device: torch.device) -> Any:
    voted = _votes_counted(every=100)
    spec = tiny_spec(parallel={"dp": 2}, train={"steps": 12, "log_every": 1000})
    trainer = Trainer(
        spec,
        world_size=world_size,
        device=device,
        hooks=TrainerHooks(after_backward=_poison_rank_1),
    )
    try:
        trainer.train()
    except NonFiniteLoss as err:
        return err.step, err.batch, trainer.step, voted
    return None


def test_a_nonfinite_loss_between_votes_is_found_at_the_next_with_its_first_step() -> None:
    """Rank 1's loss goes NaN at step 5 and rank 0's at 6 (the all-reduced gradients
    carry it); nobody reads a loss until the last step's vote, where every rank raises
    for step 5, the first any rank saw, and its batch."""
    ranks = on_ranks(_nonfinite_between_votes, 2, timeout_s=120)
    assert ranks == [(5, 5, 11, [1, 2, 12])] * 2
