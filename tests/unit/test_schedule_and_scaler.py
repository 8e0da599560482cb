"""Warmup + cosine learning rate; the fp16 loss scaler's bookkeeping."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from shardline.workers.engine.precision import DynamicLossScaler
from shardline.workers.engine.schedule import lr_at


def test_warmup_then_cosine_to_min_lr() -> None:
    kw: dict[str, Any] = {"lr": 1.0, "min_lr": 0.1, "warmup_steps": 10, "total_steps": 110}
    assert lr_at(1, **kw) == pytest.approx(0.1)
    assert lr_at(10, **kw) == pytest.approx(1.0)
    assert lr_at(60, **kw) == pytest.approx(0.55)
    assert lr_at(110, **kw) == pytest.approx(0.1)


def test_scaler_halves_on_inf_and_grows_after_clean_steps() -> None:
    scaler = DynamicLossScaler(enabled=True, init_scale=8.0, growth_interval=2)
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.tensor([8.0, math.inf, 8.0])
    assert scaler.unscale_and_check([p]) is True
    scaler.update(True)
    assert scaler.scale == 4.0 and scaler.skipped_steps == 1
    p.grad = torch.tensor([4.0, 4.0, 4.0])
    assert scaler.unscale_and_check([p]) is False
    assert torch.equal(p.grad, torch.ones(3))
    scaler.update(False)
    scaler.update(False)
    assert scaler.scale == 8.0
    restored = DynamicLossScaler(enabled=True)
    restored.load_state_dict(scaler.state_dict())
    assert restored.state_dict() == scaler.state_dict()


def test_disabled_scaler_changes_nothing() -> None:
    scaler = DynamicLossScaler(enabled=False)
    loss = torch.tensor(2.0)
    assert scaler.scale_loss(loss) is loss
    assert scaler.unscale_and_check([]) is False
