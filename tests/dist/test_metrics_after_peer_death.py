"""A rank dies after a step's checkpoint committed, before that step's metrics were
gathered: rank 0 still hands the step's metrics on. A restore from that checkpoint trains
on after it, so metrics lost here would be lost for good (the recovery bench once saw a
job SUCCEED with step 36 missing, restored from step 36)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.storage.layout import CheckpointLocations

DIES_AT = 2


def _train_while_rank_1_dies(folder: str, rank: int, world_size: int, device: torch.device) -> Any:
    seen: list[dict[str, Any]] = []
    trainer = Trainer(
        tiny_spec(parallel={"dp": 2}, train={"steps": 6}, checkpoint={"every_steps": DIES_AT}),
        world_size=world_size,
        device=device,
        checkpoints=CheckpointLocations(save_url=folder),
        hooks=TrainerHooks(on_metrics=seen.append),
    )
    if rank == 1:  # dies once its step-2 checkpoint is in, as the step's metrics gather
        gather = trainer.metrics._gather

        def dies(metrics: dict[str, Any]) -> None:
            if metrics["step"] == DIES_AT:
                os._exit(0)
            gather(metrics)

        trainer.metrics._gather = dies  # type: ignore[method-assign]
    with pytest.raises(Exception):  # noqa: B017 (gloo's error for a peer gone)
        trainer.train()
    return [m["step"] for m in seen]


def test_a_step_checkpointed_before_a_peer_died_keeps_its_metrics(tmp_path: Path) -> None:
    steps = on_ranks(
        functools.partial(_train_while_rank_1_dies, str(tmp_path)),
        2,
        timeout_s=120,
        dying=frozenset({1}),
    )
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [DIES_AT]
    assert steps[0] == [1, DIES_AT]
