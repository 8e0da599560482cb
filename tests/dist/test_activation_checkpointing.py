"""Recomputing activations changes memory, never the numbers."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from tests.dist.runs import tiny_spec
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer


def losses(device: torch.device, mode: str) -> tuple[list[float], Trainer]:
    metrics: list[dict[str, Any]] = []
    trainer = Trainer(
        tiny_spec(train={"steps": 4, "activation_checkpointing": mode}),
        world_size=1,
        device=device,
        hooks=TrainerHooks(on_metrics=metrics.append),
    )
    trainer.train()
    return [m["loss"] for m in metrics], trainer


@pytest.mark.parametrize(("mode", "wrapped"), [("full", 4), ("selective", 2)])
def test_checkpointed_training_matches_plain_training(
    one_rank_world: torch.device, mode: str, wrapped: int
) -> None:
    plain, _ = losses(one_rank_world, "none")
    ours, trainer = losses(one_rank_world, mode)
    assert ours == pytest.approx(plain, rel=1e-6)
    blocks = list(trainer.model.layers.values())  # type: ignore[operator]
    assert sum(isinstance(b, CheckpointWrapper) for b in blocks) == wrapped
