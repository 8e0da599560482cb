"""bf16 and fp16 train; fp16 survives an inf in its gradients."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.runs import run, tiny_spec
from workers.engine.trainer import Trainer


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_across_data_parallel_ranks(precision: str) -> None:
    metrics, summary = run(
        tiny_spec(precision=precision, parallel={"dp": 2, "zero_stage": 2},
                  train={"steps": 20})
    )
    losses = [m["loss"] for m in metrics]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.7 * losses[0], losses
    assert summary["layout"].endswith(precision)


def test_fp16_skips_a_step_with_an_inf_and_backs_off(one_rank_world: torch.device) -> None:
    poisoned_step = 4

    def poison(step: int, parts: list[nn.Module]) -> None:
        if step == poisoned_step:
            grad = next(iter(parts[0].parameters())).grad
            assert grad is not None
            grad.view(-1)[0] = math.inf

    metrics: list[dict[str, Any]] = []
    trainer = Trainer(tiny_spec(precision="fp16", train={"steps": 12}), world_size=1,
                      device=one_rank_world, on_metrics=metrics.append, grad_hook=poison)
    weights_at: dict[int, dict[str, torch.Tensor]] = {}
    original_step = trainer.train_step

    def step_and_snapshot() -> dict[str, Any]:
        m = original_step()
        weights_at[m["step"]] = {n: p.detach().clone() for n, p in
                                 trainer.model.named_parameters()}
        return m

    trainer.train_step = step_and_snapshot  # type: ignore[method-assign]
    trainer.train()

    by_step = {m["step"]: m for m in metrics}
    skipped = by_step[poisoned_step]
    assert skipped["skipped"] is True and skipped["grad_norm"] is None
    assert skipped["loss_scale"] == by_step[poisoned_step - 1]["loss_scale"] / 2
    assert by_step[12]["skipped_steps"] == 1
    assert not any(by_step[s]["skipped"] for s in by_step if s != poisoned_step)
    # The skipped step left the weights exactly as they were.
    for name, value in weights_at[poisoned_step].items():
        assert torch.equal(value, weights_at[poisoned_step - 1][name]), name
    assert all(math.isfinite(m["loss"]) for m in metrics)
    assert by_step[12]["loss"] < by_step[1]["loss"]
