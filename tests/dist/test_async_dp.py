"""Asynchronous data parallelism on real gloo ranks: every batch of the sync layout is
pushed once, the replicas meet on the same parameters, a stop waits for the next meeting
and resumes there, and checkpoints carry the shards' optimizer state both ways between
async and sync."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from shardline.workers.contract.memory_model import model_state_bytes
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import LocalCheckpoints, train_local
from shardline.workers.engine.nonfinite import NonFiniteLoss
from shardline.workers.engine.data.loader import Batch
from shardline.workers.engine.experimental.async_dp import AsyncStrategy
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore, RestoreSource
from shardline.workers.storage.layout import CheckpointLocations


def spec_of(mode: str, steps: int = 12) -> JobSpec:
    return tiny_spec(
        parallel={"dp": 2, "dp_mode": mode},
        train={"steps": steps, "log_every": 4},
        checkpoint={"every_steps": 4, "keep_last": 5},
    )


def _trained(rank: int, world_size: int, device: torch.device) -> tuple[Any, float]:
    metrics: list[dict[str, Any]] = []
    trainer = Trainer(
        spec_of("async"),
        world_size=world_size,
        device=device,
        hooks=TrainerHooks(on_metrics=metrics.append),
    )
    trainer.train()
    total = sum(float(p.detach().double().sum()) for p in trainer.parts.parameters())
    rows = [{k: v for k, v in m.items() if k != "breakdown"} for m in metrics]
    return rows, total


def test_every_batch_is_pushed_once_and_the_replicas_end_on_the_same_parameters() -> None:
    (metrics, ours), (_, theirs) = on_ranks(_trained, 2, timeout_s=120)
    assert ours == theirs  # met at the last step: every rank holds every shard's newest
    assert [m["step"] for m in metrics] == [1, 4, 8, 12]
    # Each (step, rank) batch of the sync layout once: 2 per step, by whichever replica.
    assert [m["pushes"] for m in metrics] == [2, 6, 8, 8]
    assert all(m["grad_bytes"] > 0 for m in metrics)
    assert all(m["staleness_max"] <= 2 and m["stale_dropped"] == 0 for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    # What a rank holds: the whole model and its gradients, and a shard's masters and
    # AdamW moments, about half of the parameters each; as the memory model says.
    spec = spec_of("async")
    predicted = model_state_bytes(spec.model.resolved(), spec.parallel)
    for kind, want in predicted.items():
        assert metrics[-1]["mem_bytes"][kind] == pytest.approx(want, rel=0.05), kind


def run(spec: JobSpec, local: LocalCheckpoints) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(spec, 2, on_metrics=metrics.append, local=local)
    return metrics


def test_a_stop_between_meetings_waits_for_the_next_and_resumes_there(tmp_path: Path) -> None:
    spec = spec_of("async")
    first = run(spec, LocalCheckpoints(str(tmp_path), stop_after_step=5))
    assert [m["step"] for m in first] == [1, 4, 8]  # asked after 5, stopped at 8
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [8, 4]
    resumed = run(spec, LocalCheckpoints(str(tmp_path), resume=True))
    assert [(m["step"], m["pushes"]) for m in resumed] == [(12, 8)]
    assert resumed[-1]["loss"] < first[0]["loss"]


def _moments(folder: str, mode: str, rank: int, world_size: int, device: torch.device) -> float:
    """The optimizer state this rank restored from `folder`, summed."""
    trainer = Trainer(
        spec_of(mode),
        world_size=world_size,
        device=device,
        checkpoints=CheckpointLocations(restore_from=(RestoreSource(folder),)),
    )
    assert trainer.step == 8
    if isinstance(trainer.strategy, AsyncStrategy):
        state = trainer.strategy.replica.shard.state_dict()
        trainer.strategy.close()  # its server waits for the other replica's word
    else:
        state = trainer.optimizers.state_dict()
    return sum(float(v.double().sum()) for k, v in state.items() if not k.endswith(".step"))


def test_checkpoints_carry_the_optimizer_state_between_async_and_sync(tmp_path: Path) -> None:
    for saved in ("async", "sync"):
        folder = tmp_path / saved
        run(spec_of(saved, steps=8), LocalCheckpoints(str(folder)))
        shards = on_ranks(functools.partial(_moments, str(folder), "async"), 2, timeout_s=120)
        whole = on_ranks(functools.partial(_moments, str(folder), "sync"), 2, timeout_s=120)
        # Each async rank restored the state of the parameters it serves, a sync rank of
        # all of them: together the shards hold it all, once.
        assert whole[0] == whole[1] != 0.0
        assert abs(sum(shards) - whole[0]) <= 1e-9 * abs(whole[0]), saved
        assert all(s != 0.0 for s in shards)


def _one_rank_diverges(rank: int, world_size: int, device: torch.device) -> tuple[str, int]:
    """Rank 1's third batch has a non-finite loss; what each rank raised, and for which
    step."""
    trainer = Trainer(spec_of("async"), world_size=world_size, device=device)
    trained = trainer.forward_backward
    batches = [0]

    def diverging(batch: Batch) -> torch.Tensor:
        batches[0] += 1
        loss = trained(batch)
        return loss * math.nan if rank == 1 and batches[0] == 3 else loss

    trainer.forward_backward = diverging  # type: ignore[method-assign]
    try:
        trainer.train()
    except NonFiniteLoss as err:
        return type(err).__name__, err.step
    return "trained on", trainer.step


def test_a_non_finite_loss_on_one_replica_stops_every_replica_at_the_meeting() -> None:
    """In sync every rank sees the step's loss; here only the replica that trained the
    batch does, so the meeting tells the others, and all raise for the same step (the
    supervisor's rollback then finds every rank stopped, none waiting in a push)."""
    ours, theirs = on_ranks(_one_rank_diverges, 2, timeout_s=120)
    assert ours == theirs
    assert ours[0] == "NonFiniteLoss" and 2 <= ours[1] <= 4  # rank 1's third batch
