"""Checkpoints: exact resume in every ZeRO stage and tp/pp layout, and restoring a
checkpoint into other layouts (the batch of a step depends only on (seed, step), so
continuing anywhere must give the same losses)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.dist.runs import tiny_spec
from shardline.workers.contract.events import RESTORED_METRICS
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.engine.launch import LocalCheckpoints, train_local
from shardline.workers.engine.schedule import lr_at
from shardline.workers.contract.spec import JobSpec

STEPS, SAVED = 8, 4
TRAIN = {"steps": STEPS, "warmup_steps": 2}
CHECKPOINT = {"every_steps": SAVED, "keep_last": 3}

SOURCES: dict[str, dict[str, Any]] = {
    "dp2-zero0": {"dp": 2, "zero_stage": 0},
    "dp2-zero1": {"dp": 2, "zero_stage": 1},
    "dp2-zero2": {"dp": 2, "zero_stage": 2},
    "dp2-tp2-zero3": {"dp": 2, "tp": 2, "zero_stage": 3},
    "pp2-tp2": {"pp": 2, "tp": 2},
    "dp2-tp2-zero1": {"dp": 2, "tp": 2, "zero_stage": 1},
}


def layout_spec(parallel: dict[str, Any], **sections: Any) -> JobSpec:
    return tiny_spec(parallel=parallel, train=TRAIN, checkpoint=CHECKPOINT, **sections)


def train(spec: JobSpec, local: LocalCheckpoints) -> tuple[list[dict[str, Any]], list[str]]:
    metrics: list[dict[str, Any]] = []
    events: list[str] = []
    train_local(
        spec,
        spec.parallel.world_size,
        on_metrics=metrics.append,
        local=local,
        on_event=events.append,
    )
    return metrics, events


def losses(metrics: list[dict[str, Any]]) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in metrics}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Each source layout trained straight through, saving at step 4 (and 8)."""
    runs = {}
    for name, parallel in SOURCES.items():
        folder = tmp_path_factory.mktemp(name)
        metrics, _ = train(layout_spec(parallel), LocalCheckpoints(str(folder)))
        runs[name] = {"folder": folder, "losses": losses(metrics)}
    return runs


def assert_resumes_exactly(spec: JobSpec, tmp_path: Path) -> dict[int, float]:
    """`spec` stopped after step 3 and resumed trains as if never stopped (1e-6); returns
    the uninterrupted run's losses, whose checkpoint of step SAVED is in
    `tmp_path / "straight"`."""
    straight, _ = train(spec, LocalCheckpoints(str(tmp_path / "straight")))
    want = losses(straight)
    first, _ = train(spec, LocalCheckpoints(str(tmp_path / "stopped"), stop_after_step=3))
    assert [m["step"] for m in first] == [1, 2, 3]
    resumed, _ = train(spec, LocalCheckpoints(str(tmp_path / "stopped"), resume=True))
    assert [m["step"] for m in resumed] == list(range(4, STEPS + 1))
    for m in resumed:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-6), f"step {m['step']}"
    return want


def folder_with_step(source: Path, step: int, dest: Path) -> str:
    """A fresh checkpoints folder holding only `source`'s checkpoint of `step`."""
    name = f"step-{step:08d}"
    shutil.copytree(source / name, dest / name)
    return str(dest)


@pytest.mark.parametrize("name", list(SOURCES))
def test_stopped_run_resumes_exactly(
    name: str, uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    """Stopped after step 3 (checkpoint on stop), resumed: steps 4..8 as if never stopped."""
    spec = layout_spec(SOURCES[name])
    first, _ = train(spec, LocalCheckpoints(str(tmp_path), stop_after_step=3))
    assert [m["step"] for m in first] == [1, 2, 3]
    assert CheckpointStore(str(tmp_path)).find().step == 3  # type: ignore[union-attr]
    resumed, events = train(spec, LocalCheckpoints(str(tmp_path), resume=True))
    assert any("restored checkpoint step 3" in e for e in events), events
    assert [m["step"] for m in resumed] == list(range(4, STEPS + 1))
    want = uninterrupted[name]["losses"]
    for m in resumed:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-6), f"step {m['step']}"
        assert m["lr"] == pytest.approx(
            lr_at(
                m["step"],
                lr=spec.train.lr,
                min_lr=spec.train.min_lr,
                warmup_steps=spec.train.warmup_steps,
                total_steps=STEPS,
            )
        )


@pytest.mark.parametrize("source", ["dp2-tp2-zero3", "pp2-tp2"])
@pytest.mark.parametrize(
    "target",
    [
        {"dp": 4, "zero_stage": 1},
        {"pp": 2, "dp": 2, "pp_schedule": "interleaved_1f1b", "pp_virtual_stages": 2},
        {},
    ],
    ids=["dp4-zero1", "pp2-dp2-interleaved", "one-process"],
)
def test_checkpoint_restores_into_another_layout(
    source: str, target: dict[str, Any], uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    folder = folder_with_step(uninterrupted[source]["folder"], SAVED, tmp_path)
    metrics, events = train(layout_spec(target), LocalCheckpoints(folder, resume=True))
    assert any(f"restored checkpoint step {SAVED}" in e for e in events), events
    assert [m["step"] for m in metrics] == list(range(SAVED + 1, STEPS + 1))
    want = uninterrupted[source]["losses"]
    for m in metrics:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-4), f"step {m['step']}"


def test_keep_last_holds_and_only_committed_checkpoints_are_listed(
    uninterrupted: dict[str, Any],
) -> None:
    folder: Path = uninterrupted["dp2-zero1"]["folder"]
    store = CheckpointStore(str(folder))
    assert [c.step for c in store.committed()] == [8, 4]
    assert sorted(p.name for p in folder.iterdir()) == ["step-00000004", "step-00000008"]
    manifest = store.find(8).manifest  # type: ignore[union-attr]
    assert manifest["layout"].startswith("pp=1,dp=2,tp=1,zero=1")
    assert manifest["trainer"]["step"] == 8 and manifest["world_size"] == 2
    # each rank checksummed its own shard file; rank 0 also the DCP metadata
    ranks = {name: entry["rank"] for name, entry in manifest["files"].items()}
    assert ranks == {".metadata": 0, "__0_0.distcp": 0, "__1_0.distcp": 1}


@pytest.mark.parametrize("name", ["dp2-zero2", "pp2-tp2"])
def test_a_checkpoint_holds_its_logged_step_s_metrics(
    name: str, uninterrupted: dict[str, Any]
) -> None:
    """An async save may commit before rank 0 logs its step; a world restored from it
    never logs that step again, so the manifest keeps the step's metrics for the restore
    event to carry (workers/runtime/supervisor/relay.py records them)."""
    run = uninterrupted[name]
    committed = CheckpointStore(str(run["folder"])).committed()
    assert [c.step for c in committed] == [8, 4]
    for ckpt in committed:
        logged = ckpt.manifest["trainer"][RESTORED_METRICS]
        assert logged["step"] == ckpt.step
        assert logged["loss"] == run["losses"][ckpt.step]
        assert {"grad_norm", "lr", "step_time_s"} <= logged.keys()


@pytest.mark.parametrize("name", ["dp2-zero1", "dp2-tp2-zero1"])
def test_a_corrupt_shard_checked_by_rank_1_is_skipped(
    name: str, uninterrupted: dict[str, Any], tmp_path: Path
) -> None:
    """Each rank checks a share of the files; a bad one that rank 1 checks (not rank 0)
    must still make every rank skip that checkpoint and restore the one before."""
    source: Path = uninterrupted[name]["folder"]
    folder = tmp_path / "checkpoints"
    shutil.copytree(source, folder)
    newest = CheckpointStore(str(folder)).find(STEPS)
    assert newest is not None
    world = newest.manifest["world_size"]
    checked_by_rank_1 = sorted(newest.manifest["files"])[1::world]
    shard = folder / f"step-{STEPS:08d}" / checked_by_rank_1[0]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(data))

    metrics, events = train(layout_spec(SOURCES[name]), LocalCheckpoints(str(folder), resume=True))
    skipped = f"checkpoint step {STEPS} skipped: {checked_by_rank_1[0]} has checksum"
    assert any(e.startswith(skipped) for e in events), events
    assert any(f"restored checkpoint step {SAVED}" in e for e in events), events
    assert [m["step"] for m in metrics] == list(range(SAVED + 1, STEPS + 1))
    want = uninterrupted[name]["losses"]
    for m in metrics:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-6), f"step {m['step']}"
