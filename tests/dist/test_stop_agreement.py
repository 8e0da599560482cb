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

import torch

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from workers.engine.trainer import Trainer
from workers.storage.checkpoints import CheckpointStore
from workers.storage.layout import CheckpointLocations

ASKED_AT = {0: 3, 1: 4}  # the step after which each rank first sees the request


def _train_until_asked(folder: str, rank: int, world_size: int, device: torch.device) -> int:
    spec = tiny_spec(parallel={"dp": 2}, train={"steps": 20})
    trainer = Trainer(
        spec,
        world_size=world_size,
        device=device,
        checkpoints=CheckpointLocations(save_url=folder),
    )
    trainer.train(lambda step: step >= ASKED_AT[rank], save_on_stop=lambda: rank == 0)
    return trainer.step


def test_ranks_asked_to_stop_at_different_steps_stop_and_save_together(tmp_path: Path) -> None:
    steps = on_ranks(functools.partial(_train_until_asked, str(tmp_path)), 2, timeout_s=120)
    assert steps == [3, 3]
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [3]
