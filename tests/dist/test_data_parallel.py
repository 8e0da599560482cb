"""Data parallelism at dp=4 with every ZeRO stage trains exactly like one process."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from typing import Any

import pytest
import torch
from torch import nn

from tests.dist.ranks import on_ranks
from tests.dist.runs import run, tiny_spec
from shardline.workers.contract.memory_model import model_state_bytes
from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer


@pytest.fixture(scope="module")
def single_process() -> list[dict[str, Any]]:
    metrics, _ = run(tiny_spec())
    return metrics


@pytest.fixture(scope="module")
def zero_runs() -> dict[int, list[dict[str, Any]]]:
    return {
        stage: run(tiny_spec(parallel={"dp": 4, "zero_stage": stage}))[0] for stage in (0, 1, 2, 3)
    }


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_step_loss_matches_single_process(
    stage: int, single_process: list[dict[str, Any]], zero_runs: dict[int, list[dict[str, Any]]]
) -> None:
    ours = zero_runs[stage]
    assert [m["step"] for m in ours] == list(range(1, 11))
    for ref, got in zip(single_process, ours, strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"step {got['step']}"
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    # The run must actually learn, or equal losses would prove little.
    assert ours[-1]["loss"] < ours[0]["loss"] * 0.9


def test_zero_stages_shrink_what_each_rank_holds(
    single_process: list[dict[str, Any]], zero_runs: dict[int, list[dict[str, Any]]]
) -> None:
    full = single_process[-1]["mem_bytes"]
    held = {stage: runs[-1]["mem_bytes"] for stage, runs in zero_runs.items()}

    def fraction(stage: int, kind: str) -> float:
        return held[stage][kind] / full[kind]

    # The table in docs/benchmarks.md is these figures. zero-0 replicates everything.
    assert held[0] == full
    # ZeroRedundancyOptimizer partitions whole parameters, so not exactly a quarter.
    assert fraction(1, "optim") <= 0.30
    assert fraction(1, "params") == fraction(1, "grads") == 1.0
    # FSDP2 shards every tensor evenly (up to padding): a quarter each at dp=4, with
    # parameters counted between steps (see the test above for during a step).
    for stage in (2, 3):
        for kind in ("params", "grads", "optim"):
            assert fraction(stage, kind) == pytest.approx(0.25, abs=0.01), (stage, kind)
    # The memory model, from the spec alone, within 5% of every stage's measured bytes.
    for stage, measured in held.items():
        spec = tiny_spec(parallel={"dp": 4, "zero_stage": stage})
        predicted = model_state_bytes(spec.model.resolved(), spec.parallel)
        for kind, want in predicted.items():
            assert measured[kind] == pytest.approx(want, rel=0.05), (stage, kind)


def held_fraction(tensors: Sequence[torch.Tensor]) -> float:
    """How much of these (possibly sharded) tensors this rank holds: 1.0 when whole."""
    return sum(local_part(t).numel() for t in tensors) / sum(t.numel() for t in tensors)


def inside_a_zero_step(
    stage: int, rank: int, world_size: int, device: torch.device
) -> dict[str, float]:
    """What one rank holds of the transformer blocks at two moments of a training step."""
    seen: dict[str, float] = {}
    spec = tiny_spec(parallel={"dp": world_size, "zero_stage": stage}, train={"steps": 2})

    def unwrap(model: nn.Module) -> nn.Module:
        inner = model.module if isinstance(model, nn.parallel.DistributedDataParallel) else model
        assert isinstance(inner, nn.Module)
        return inner

    def blocks(model: nn.Module) -> list[nn.Module]:
        return list(unwrap(model).get_submodule("layers").children())

    def at_optimizer_step(step: int, parts: list[nn.Module]) -> None:
        params = [p for b in blocks(parts[0]) for p in b.parameters()]
        seen["params_at_step"] = held_fraction(params)
        seen["grads_at_step"] = held_fraction([p.grad for p in params if p.grad is not None])

    trainer = Trainer(
        spec,
        world_size=world_size,
        device=device,
        hooks=TrainerHooks(after_backward=at_optimizer_step),
    )

    def after_last_block(_module: nn.Module, _args: Any) -> None:
        # Every block has run forward; none has run backward yet.
        seen["params_in_forward"] = held_fraction(
            [p for b in blocks(trainer.model) for p in b.parameters()]
        )

    unwrap(trainer.model).get_submodule("norm").register_forward_pre_hook(after_last_block)
    trainer.train()
    return seen


@pytest.mark.parametrize(
    ("stage", "expected"),
    [
        # DDP: everything whole, always.
        (0, {"params_in_forward": 1.0, "params_at_step": 1.0, "grads_at_step": 1.0}),
        # ZeRO-2: parameters gathered once and kept whole through forward and backward;
        # gradients (and so the optimizer's updates) sharded.
        (2, {"params_in_forward": 1.0, "params_at_step": 0.5, "grads_at_step": 0.5}),
        # ZeRO-3: each block gives its gathered parameters back right after its forward.
        (3, {"params_in_forward": 0.5, "params_at_step": 0.5, "grads_at_step": 0.5}),
    ],
)
def test_zero_stage_decides_what_is_whole_during_the_step(
    stage: int, expected: dict[str, float]
) -> None:
    for seen in on_ranks(partial(inside_a_zero_step, stage), world_size=2):
        assert seen == pytest.approx(expected, abs=0.02), f"zero-{stage}: {seen}"
