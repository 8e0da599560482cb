"""A job whose ranks came from the warm pool tells the pool to replace them when its
workers are released, if it had not yet: a job that ends before its ranks are seen
training (a short one, a failed start) must not leave the pool empty until the pool's
own timer, 30 s later, while the next job starts its ranks from nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime import group_callbacks
from shardline.workers.runtime.group_callbacks import PoolLending, SnapshotCleanup
from shardline.workers.runtime.spares import PastFirstStep
from shardline.workers.runtime.worker_group import WorkerGroup
from shardline.workers.storage.layout import CheckpointLocations, JobLayout

SPEC = {
    "name": "pooled",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2},
    "train": {"steps": 3, "global_batch_size": 4, "micro_batch_size": 2},
}


@pytest.fixture
def told(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What the group said to the pool (the Ray calls replaced: no cluster here)."""
    calls: list[str] = []
    monkeypatch.setattr(group_callbacks, "refill_pool", lambda: calls.append("refill"))
    monkeypatch.setattr(group_callbacks, "remove_snapshots_on", lambda nodes, layout: None)
    return calls


def group(tmp_path: Path, lending: PoolLending) -> WorkerGroup:
    layout = JobLayout(storage_root=str(tmp_path), job_id="job-1")
    return WorkerGroup(
        JobSpec.model_validate(SPEC),
        layout,
        CheckpointLocations(),
        worker_actor=None,
        callbacks=[lending, SnapshotCleanup()],
    )


def test_a_released_group_tells_the_pool_once(told: list[str], tmp_path: Path) -> None:
    lending = PoolLending()
    g = group(tmp_path, lending)
    lending.refill = PastFirstStep()  # took ranks from the pool; not yet seen training
    g.release()
    assert told == ["refill"]
    assert lending.refill is None
    g.release()  # released again (a cancel after a failure): nothing more to say
    assert told == ["refill"]


def test_a_group_that_took_nothing_from_the_pool_says_nothing(
    told: list[str], tmp_path: Path
) -> None:
    g = group(tmp_path, PoolLending())
    g.release()
    assert told == []
