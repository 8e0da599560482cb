"""bf16 and fp16 compute in low precision over fp32 weights and reductions, train, and
fp16 survives an inf in its gradients."""

from __future__ import annotations

import math
import shutil
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.ranks import on_ranks
from tests.dist.runs import run, tiny_spec
from shardline.workers.engine.dtensor import local_part
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import RestoreSource
from shardline.workers.storage.layout import CheckpointLocations


def inside_a_mixed_precision_step(
    precision: str, rank: int, world_size: int, device: torch.device
) -> dict[str, list[str]]:
    """On one rank of a dp=2, ZeRO-2 run: the dtypes that matmuls produced, that the
    weights and gradients had at the optimizer step, and that gradients were reduced in."""
    seen: dict[str, set[str]] = {
        "matmul": set(),
        "weights": set(),
        "grads": set(),
        "reduced": set(),
    }
    reduce_scatter = dist.reduce_scatter_single

    def recording_reduce_scatter(*args: Any, **kwargs: Any) -> Any:
        seen["reduced"].add(str(kwargs["input"].dtype))
        return reduce_scatter(*args, **kwargs)

    # FSDP2 looks the collective up on the module at call time; this is a child process.
    dist.reduce_scatter_single = recording_reduce_scatter

    def at_optimizer_step(step: int, parts: list[nn.Module]) -> None:
        for p in parts[0].parameters():
            assert p.grad is not None
            seen["weights"].add(str(local_part(p).dtype))
            seen["grads"].add(str(local_part(p.grad).dtype))

    spec = tiny_spec(
        precision=precision, parallel={"dp": world_size, "zero_stage": 2}, train={"steps": 2}
    )
    trainer = Trainer(
        spec,
        world_size=world_size,
        device=device,
        hooks=TrainerHooks(after_backward=at_optimizer_step),
    )
    for module in trainer.model.modules():
        if isinstance(module, nn.Linear):
            module.register_forward_hook(lambda _m, _i, out: seen["matmul"].add(str(out.dtype)))
    trainer.train()
    return {kind: sorted(dtypes) for kind, dtypes in seen.items()}


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_computes_low_but_keeps_and_reduces_fp32(precision: str) -> None:
    compute = {"bf16": "torch.bfloat16", "fp16": "torch.float16"}[precision]
    for seen in on_ranks(partial(inside_a_mixed_precision_step, precision), world_size=2):
        assert seen == {
            "matmul": [compute],  # every projection ran in the low precision
            "weights": ["torch.float32"],  # fp32 master weights
            "grads": ["torch.float32"],
            "reduced": ["torch.float32"],  # gradients reduce-scattered in fp32
        }


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_across_data_parallel_ranks(precision: str) -> None:
    metrics, summary = run(
        tiny_spec(precision=precision, parallel={"dp": 2, "zero_stage": 2}, train={"steps": 20})
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
    trainer = Trainer(
        tiny_spec(precision="fp16", train={"steps": 12}),
        world_size=1,
        device=one_rank_world,
        hooks=TrainerHooks(on_metrics=metrics.append, after_backward=poison),
    )
    weights_at: dict[int, dict[str, torch.Tensor]] = {}
    original_step = trainer.train_step

    def step_and_snapshot() -> dict[str, Any]:
        m = original_step()
        weights_at[m["step"]] = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
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


def test_fp16_resume_restores_the_loss_scaler(one_rank_world: torch.device, tmp_path: Path) -> None:
    """A step skipped for an inf before the checkpoint halves the scale and counts a skip;
    a run resumed from that checkpoint goes on with the same scale, count and losses."""

    def poison(step: int, parts: list[nn.Module]) -> None:
        if step == 2:
            grad = next(iter(parts[0].parameters())).grad
            assert grad is not None
            grad.view(-1)[0] = math.inf

    spec = tiny_spec(precision="fp16", train={"steps": 6}, checkpoint={"every_steps": 3})

    def trainer(
        folder: Path, resume: bool, after_backward: Any = None
    ) -> tuple[Trainer, list[Any]]:
        metrics: list[dict[str, Any]] = []
        where = CheckpointLocations(
            save_url=str(folder), restore_from=(RestoreSource(str(folder)),) if resume else ()
        )
        made = Trainer(
            spec,
            world_size=1,
            device=one_rank_world,
            checkpoints=where,
            hooks=TrainerHooks(on_metrics=metrics.append, after_backward=after_backward),
        )
        return made, metrics

    straight, whole = trainer(tmp_path / "straight", False, after_backward=poison)
    straight.train()
    at_save = {m["step"]: m for m in whole}[3]
    assert at_save["skipped_steps"] == 1 and at_save["loss_scale"] == 2.0**15
    # Only the checkpoint of step 3 (the one of step 6 would leave nothing to train).
    name = "step-00000003"
    shutil.copytree(tmp_path / "straight" / name, tmp_path / "resumed" / name)
    again, rest = trainer(tmp_path / "resumed", True)
    again.train()
    assert [m["step"] for m in rest] == [4, 5, 6]
    for got, want in zip(rest, whole[3:], strict=True):
        assert (got["loss_scale"], got["skipped_steps"]) == (want["loss_scale"], 1), got
        assert got["loss"] == want["loss"], got["step"]
