"""What makes a checkpoint restorable: the manifest, sizes and checksums, the commit.

One rank in this process (the `one_rank_world` fixture) drives a Trainer directly.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.dist.runs import tiny_spec
from shardline.workers.storage.layout import CheckpointLocations
from shardline.workers.storage.checkpoints import MANIFEST, CheckpointStore, RestoreSource
from shardline.workers.engine.hooks import TrainerHooks
from shardline.workers.engine.trainer import Trainer


def make_trainer(
    folder: Path,
    *,
    resume: bool,
    async_save: bool = False,
    events: list[str] | None = None,
    commits: list[dict[str, Any]] | None = None,
    steps: int = 6,
) -> Trainer:
    spec = tiny_spec(
        train={"steps": steps, "warmup_steps": 1},
        checkpoint={"every_steps": 2, "keep_last": 5, "async_save": async_save},
    )
    plan = CheckpointLocations(
        save_url=str(folder),
        restore_from=(RestoreSource(str(folder)),) if resume else (),
    )
    sink = events.append if events is not None else None
    return Trainer(
        spec,
        world_size=1,
        device=torch.device("cpu"),
        checkpoints=plan,
        hooks=TrainerHooks(
            on_event=(lambda event: sink(event.message)) if sink else None,
            on_checkpoint=commits.append if commits is not None else None,
        ),
    )


def trained(folder: Path, **kwargs: Any) -> Trainer:
    trainer = make_trainer(folder, resume=False, **kwargs)
    trainer.train()
    return trainer


def test_truncated_shard_is_skipped_and_the_previous_checkpoint_used(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    trained(tmp_path)
    shard = tmp_path / "step-00000006" / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[:1000])
    events: list[str] = []
    trainer = make_trainer(tmp_path, resume=True, events=events)
    assert trainer.step == 4
    assert any("checkpoint step 6 skipped: __0_0.distcp has 1000 bytes" in e for e in events)


def test_wrong_checksum_in_manifest_is_skipped(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    trained(tmp_path)
    path = tmp_path / "step-00000006" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["files"]["__0_0.distcp"]["crc32"] = "00000000"
    path.write_text(json.dumps(manifest))
    events: list[str] = []
    trainer = make_trainer(tmp_path, resume=True, events=events)
    assert trainer.step == 4
    assert any("skipped: __0_0.distcp has checksum" in e for e in events), events


def test_restored_state_equals_the_saved_state(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    first = trained(tmp_path)
    again = make_trainer(tmp_path, resume=True)
    assert again.step == 6
    for (name, p), q in zip(first.model.named_parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q), name
    opt_a, opt_b = first.optimizers.state_dict(), again.optimizers.state_dict()
    assert opt_a.keys() == opt_b.keys() and len(opt_a) > 0
    for key in opt_a:
        assert torch.equal(opt_a[key], opt_b[key]), key


def test_a_save_that_dies_half_way_commits_nothing(
    one_rank_world: torch.device, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trainer = make_trainer(tmp_path, resume=False, steps=2)

    def die(*args: Any) -> None:
        raise OSError("disk gone")

    # The shards are written; the process dies before the manifest.
    monkeypatch.setattr(CheckpointStore, "checksums", die)
    with pytest.raises(OSError):
        trainer.train()
    assert CheckpointStore(str(tmp_path)).committed() == []
    assert [p.name for p in tmp_path.iterdir()] == [".staging-step-00000002"]
    monkeypatch.undo()
    # The next run clears the leftovers and saves normally.
    make_trainer(tmp_path, resume=True, steps=2).train()
    assert [p.name for p in tmp_path.iterdir()] == ["step-00000002"]


def test_async_save_commits_in_the_background_and_reports_its_times(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    commits: list[dict[str, Any]] = []
    trainer = trained(tmp_path, async_save=True, commits=commits)
    assert [c["step"] for c in commits] == [2, 4, 6]
    for c in commits:
        assert 0 < c["blocking_s"] <= c["save_s"]
        assert c["bytes"] > 0 and c["layout"] == trainer.layout
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [6, 4, 2]
    again = make_trainer(tmp_path, resume=True)
    for p, q in zip(trainer.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(p, q)


def test_a_run_that_finds_nothing_to_restore_trains_like_a_fresh_one(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    """Looking for a checkpoint and finding none usable (a service job's first start, or
    only a corrupt one) must leave the fresh state untouched."""
    trained(tmp_path / "b", steps=2)
    shard = tmp_path / "b" / "step-00000002" / "__0_0.distcp"
    shard.write_bytes(b"")
    fresh = make_trainer(tmp_path / "a", resume=False)
    looked = make_trainer(tmp_path / "b", resume=True)
    assert looked.checkpoints.restored is None and looked.step == 0
    losses = []
    for trainer in (fresh, looked):
        metrics: list[dict[str, Any]] = []
        trainer.metrics.on_metrics = metrics.append
        trainer.train()
        losses.append([m["loss"] for m in metrics])
    assert len(losses[0]) == 6 and losses[0] == losses[1]


def test_keep_last_never_deletes_the_checkpoint_restored_from(
    one_rank_world: torch.device, tmp_path: Path
) -> None:
    trained(tmp_path, steps=2)
    spec = tiny_spec(
        train={"steps": 6, "warmup_steps": 1}, checkpoint={"every_steps": 2, "keep_last": 1}
    )
    plan = CheckpointLocations(save_url=str(tmp_path), restore_from=(RestoreSource(str(tmp_path)),))
    trainer = Trainer(spec, world_size=1, device=torch.device("cpu"), checkpoints=plan)
    assert trainer.step == 2
    trainer.train()
    assert [c.step for c in CheckpointStore(str(tmp_path)).committed()] == [6, 2]


def test_a_process_killed_while_saving_leaves_no_committed_checkpoint(tmp_path: Path) -> None:
    """SIGKILL `shardline train` the moment a save starts: nothing half-written counts."""
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        "name: killed\n"
        "model: {preset: tiny, dim: 512, n_layers: 4, n_heads: 8, n_kv_heads: 8,"
        " vocab_size: 4096, seq_len: 32}\n"
        "train: {steps: 50, global_batch_size: 2, micro_batch_size: 1}\n"
        "checkpoint: {every_steps: 3}\n"
    )
    folder = tmp_path / "ckpt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "shardline.api.cli",
            "train",
            str(spec),
            "--checkpoint-dir",
            str(folder),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not any(folder.glob(".staging-*/*.distcp")):
            assert proc.poll() is None and time.monotonic() < deadline, "no save started"
            time.sleep(0.005)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert CheckpointStore(str(folder)).committed() == []
    staged = [p.name for p in folder.iterdir()]
    assert staged == [".staging-step-00000003"], staged
