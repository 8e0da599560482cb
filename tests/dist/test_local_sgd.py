"""Local SGD (DiLoCo) on real gloo ranks: the outer step's arithmetic, the bytes it sends,
and a run stopped between syncs that stops at the next one and resumes exactly."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch import nn

from tests.dist.ranks import on_ranks
from tests.dist.runs import tiny_spec
from shardline.workers.contract.local_sgd import DeltaDtype, LocalSgd
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.grad_compression import GradTraffic
from shardline.workers.engine.launch import LocalCheckpoints, train_local
from shardline.workers.engine.experimental.local_sgd import OuterStep
from shardline.workers.engine.trainer import Trainer
from shardline.workers.storage.checkpoints import CheckpointStore, RestoreSource
from shardline.workers.storage.layout import CheckpointLocations


def _one_sync(
    delta_dtype: str,
    lr: float,
    momentum: float,
    rank: int,
    world_size: int,
    device: torch.device,
) -> Any:
    torch.manual_seed(0)  # the same start on both replicas
    model = nn.Linear(4, 3)
    start = [p.detach().tolist() for p in model.parameters()]
    traffic = GradTraffic()
    world = dist.group.WORLD
    assert world is not None
    outer = OuterStep(
        [model],
        LocalSgd(outer_lr=lr, outer_momentum=momentum, delta_dtype=DeltaDtype(delta_dtype)),
        group=world,
        replicas=world_size,
        total_steps=100,
        traffic=traffic,
    )
    with torch.no_grad():  # the replicas move apart: rank r by (r + 1) x 0.25 everywhere
        for p in model.parameters():
            p.add_(0.25 * (rank + 1))
    outer.sync()
    # Plain lists: a tensor sent back shares its storage by a descriptor the exiting rank
    # process may close before the test has read it.
    return [p.detach().tolist() for p in model.parameters()], start, traffic.take_per_step()


@pytest.mark.parametrize(
    ("dtype", "size", "lr", "momentum"),
    [("fp32", 4, 0.7, 0.9), ("bf16", 2, 0.7, 0.9), ("fp32", 4, 1.0, 0.0)],
    ids=["nesterov", "nesterov-bf16", "plain-averaging"],
)
def test_a_sync_is_nesterov_sgd_on_the_replicas_mean_delta(
    dtype: str, size: int, lr: float, momentum: float
) -> None:
    results = on_ranks(functools.partial(_one_sync, dtype, lr, momentum), 2, timeout_s=120)
    (ours, start, sent), (theirs, _, _) = results
    # Mean delta g = anchor - mean(params) = -0.375; Nesterov's first step with a zero
    # buffer moves by lr x (1 + momentum) x g (lr 1 without momentum: the replicas' mean).
    for got_list, other, before in zip(ours, theirs, start, strict=True):
        assert got_list == other  # every replica starts the next round the same
        got = torch.tensor(got_list)
        want = torch.tensor(before) + lr * (1 + momentum) * 0.375
        assert torch.allclose(got, want, atol=1e-6 if dtype == "fp32" else 1e-2)
    assert sent == (4 * 3 + 3) * size  # one copy of the parameters, in the wire dtype


def run(spec: JobSpec, local: LocalCheckpoints) -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(spec, 2, on_metrics=metrics.append, local=local)
    return metrics


def diloco_spec(**parallel: Any) -> JobSpec:
    return tiny_spec(
        parallel={"dp": 2, **parallel},
        train={"steps": 16},
        checkpoint={"every_steps": 4, "keep_last": 5},
    )


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    spec = diloco_spec(dp_mode="local_sgd", local_sgd={"sync_every": 4})
    return run(spec, LocalCheckpoints(str(tmp_path_factory.mktemp("straight"))))


def test_replicas_send_a_quarter_of_sync_bytes_with_sync_every_4(
    straight: list[dict[str, Any]], tmp_path: Path
) -> None:
    sync = run(diloco_spec(), LocalCheckpoints())
    per_step = {m["step"]: m["grad_bytes"] for m in straight}
    model_bytes = sync[0]["grad_bytes"]  # sync all-reduces every gradient every step
    assert [s for s, b in per_step.items() if b] == [4, 8, 12, 16]
    assert {b for b in per_step.values() if b} == {model_bytes}
    assert sum(per_step.values()) / len(per_step) == model_bytes / 4
    assert [m["outer_steps"] for m in straight if m["step"] in (3, 4, 16)] == [0, 1, 4]
    assert straight[-1]["loss"] < straight[0]["loss"]


def test_a_stop_between_syncs_waits_for_the_next_and_resumes_exactly(
    straight: list[dict[str, Any]], tmp_path: Path
) -> None:
    spec = diloco_spec(dp_mode="local_sgd", local_sgd={"sync_every": 4})
    first = run(spec, LocalCheckpoints(str(tmp_path), stop_after_step=5))
    assert [m["step"] for m in first] == list(range(1, 9))  # asked after 5, stopped at 8
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [8, 4]
    resumed = run(spec, LocalCheckpoints(str(tmp_path), resume=True))
    assert [m["step"] for m in resumed] == list(range(9, 17))
    # Each replica's own AdamW moments (steps 10 on) and the outer momentum (after the
    # sync at 12) came back: the steps after the restore are those of the run that never
    # stopped.
    want = {m["step"]: m["loss"] for m in straight}
    for m in resumed:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-6), m["step"]


def _restored_moments(folder: str, rank: int, world_size: int, device: torch.device) -> float:
    trainer = Trainer(
        diloco_spec(),  # sync: the replicas step together from here
        world_size=world_size,
        device=device,
        checkpoints=CheckpointLocations(restore_from=(RestoreSource(folder),)),
    )
    assert trainer.step == 8
    state = trainer.optimizers.state_dict()
    return sum(float(v.double().sum()) for k, v in state.items() if not k.endswith(".step"))


def test_a_sync_job_resumed_from_local_sgd_starts_every_replica_the_same(tmp_path: Path) -> None:
    spec = diloco_spec(dp_mode="local_sgd", local_sgd={"sync_every": 4})
    spec = spec.model_copy(update={"train": spec.train.model_copy(update={"steps": 8})})
    run(spec, LocalCheckpoints(str(tmp_path)))
    ours, theirs = on_ranks(functools.partial(_restored_moments, str(tmp_path)), 2, timeout_s=120)
    assert ours == theirs  # both hold replica 0's moments, not each its own


def test_a_local_sgd_job_grown_to_more_replicas_goes_on_from_the_sync(
    straight: list[dict[str, Any]], tmp_path: Path
) -> None:
    """A checkpoint of 2 replicas (taken at a sync, where they hold the same weights)
    restored into 4: the new replicas start from replica 0's optimizer state, every
    replica from the synced weights, so the first step after the restore is the global
    batch's loss at those weights, the uninterrupted run's."""
    spec = diloco_spec(dp_mode="local_sgd", local_sgd={"sync_every": 4})
    run(spec, LocalCheckpoints(str(tmp_path), stop_after_step=8))
    grown = spec.model_copy(
        update={"parallel": spec.parallel.model_copy(update={"dp": 4})}, deep=True
    )
    metrics: list[dict[str, Any]] = []
    train_local(
        grown, 4, on_metrics=metrics.append, local=LocalCheckpoints(str(tmp_path), resume=True)
    )
    assert [m["step"] for m in metrics] == list(range(9, 17))
    want = {m["step"]: m["loss"] for m in straight}
    assert metrics[0]["loss"] == pytest.approx(want[9], rel=1e-5)
    assert metrics[-1]["loss"] < straight[0]["loss"]
