"""The memory model's arithmetic, against the spec's own parameter count and torch.chunk.

Its agreement with what ranks really hold is checked in tests/dist (test_layouts.py,
test_data_parallel.py), for every layout they train.
"""

from __future__ import annotations

import math

import pytest
import torch

from shardline.workers.contract.memory_model import (
    chunk_length,
    model_state_bytes,
    parameter_shapes,
)
from shardline.workers.contract.sections import ModelSpec, ParallelSpec


@pytest.mark.parametrize("preset", ["tiny", "1b", "8b"])
def test_the_shapes_add_up_to_the_specs_parameter_count(preset: str) -> None:
    model = ModelSpec(preset=preset)
    shapes = parameter_shapes(model.resolved())
    assert sum(math.prod(p.shape) for p in shapes) == model.parameter_count()


@pytest.mark.parametrize("size,parts", [(10, 4), (7, 7), (3, 4), (128, 3)])
def test_chunks_are_torch_chunks(size: int, parts: int) -> None:
    pieces = [len(c) for c in torch.arange(size).chunk(parts)]
    pieces += [0] * (parts - len(pieces))  # torch.chunk drops empty tail pieces
    assert [chunk_length(size, parts, i) for i in range(parts)] == pieces


def test_zero3_over_eight_ranks_holds_an_eighth_of_an_8b_model() -> None:
    model = ModelSpec(preset="8b")
    whole = model_state_bytes(model.resolved(), ParallelSpec())
    sharded = model_state_bytes(model.resolved(), ParallelSpec(dp=8, zero_stage=3))
    assert whole["params"] == 4 * model.parameter_count()
    assert sharded["params"] == pytest.approx(whole["params"] / 8, rel=1e-3)
    assert whole["optim"] == pytest.approx(2 * whole["params"], rel=1e-6)
