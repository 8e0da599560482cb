"""The step-time breakdown of a logged step, with a checkpoint that holds training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist.runs import tiny_spec
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.layout import CheckpointLocations


def test_logged_steps_carry_each_ranks_breakdown_and_the_checkpoint_wait(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    spec = tiny_spec(
        train={"steps": 4, "warmup_steps": 1, "log_every": 2},
        checkpoint={"every_steps": 4, "keep_last": 1},
    )
    logged: list[dict[str, Any]] = []
    armed: dict[int, bool] = {}
    trainer = Trainer(
        spec,
        world_size=1,
        device=one_rank_world,
        checkpoints=CheckpointLocations(save_url=str(tmp_path)),
        hooks=TrainerHooks(
            on_metrics=logged.append,
            on_step=lambda step: armed.update({step: trainer.clock.armed}),
        ),
    )
    trainer.train()
    assert armed == {1: True, 2: True, 3: False, 4: True}  # only logged steps are timed
    assert [m["step"] for m in logged] == [1, 2, 4]
    for m in logged:
        (row,) = m["breakdown"]  # one rank
        assert row["rank"] == 0
        parts = row["data_s"] + row["compute_s"] + row["comm_s"] + row["bubble_s"]
        assert parts == pytest.approx(row["step_s"], rel=0.1)
        assert row["step_s"] == pytest.approx(m["step_time_s"])
        assert row["compute_s"] > row["data_s"] > 0 and row["bubble_s"] == 0.0
        # One rank holds everything: its memory is the sum of the step's kinds.
        assert row["mem_bytes"] == sum(m["mem_bytes"].values()) > 0
    # The checkpoint after step 4 held training; no other step saved.
    assert logged[-1]["breakdown"][0]["checkpoint_s"] == logged[-1]["checkpoint_blocking_s"] > 0
    assert [m["breakdown"][0]["checkpoint_s"] for m in logged[:2]] == [0.0, 0.0]
