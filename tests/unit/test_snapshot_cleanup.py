"""A job's in-memory snapshots are removed from every node it was placed on, also when it
is cancelled while its ranks start (before they all joined): a rank makes its snapshot
folder while it starts."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime import group_callbacks, worker_group
from shardline.workers.runtime.group_callbacks import SnapshotCleanup
from shardline.workers.runtime.worker_group import WorkerGroup
from shardline.workers.storage.layout import JobLayout
from tests.unit.test_pool_refill import SPEC


@pytest.fixture
def removed(monkeypatch: pytest.MonkeyPatch) -> list[set[str]]:
    """The nodes the group asked to remove snapshots on (Ray's placement calls replaced:
    a placement of two bundles on two nodes, ready at once)."""
    calls: list[set[str]] = []
    monkeypatch.setattr(
        group_callbacks, "remove_snapshots_on", lambda nodes, layout: calls.append(set(nodes))
    )
    pg = SimpleNamespace(ready=lambda: None)
    monkeypatch.setattr(worker_group, "placement_group", lambda *a, **k: pg)
    monkeypatch.setattr(
        worker_group, "placement_group_table", lambda _: {"bundles_to_node_id": {0: "a", 1: "b"}}
    )
    monkeypatch.setattr(worker_group, "remove_placement_group", lambda _: None)
    monkeypatch.setattr(worker_group.ray, "get", lambda *a, **k: None)
    return calls


def group(tmp_path: Path, *, snapshots: bool) -> WorkerGroup:
    layout = JobLayout(storage_root=str(tmp_path), job_id="job-1")
    locations = layout.checkpoint_locations(snapshots=snapshots)
    spec = JobSpec.model_validate(SPEC)
    return WorkerGroup(spec, layout, locations, worker_actor=None, callbacks=[SnapshotCleanup()])


def test_a_job_released_while_its_ranks_start_removes_its_snapshots(
    removed: list[set[str]], tmp_path: Path
) -> None:
    g = group(tmp_path, snapshots=True)
    assert g.reserve(timeout_s=1) == ["a", "b"]
    g.release()  # cancelled before every rank joined: no start finished
    assert removed == [{"a", "b"}]


def test_a_job_without_snapshots_removes_none(removed: list[Any], tmp_path: Path) -> None:
    g = group(tmp_path, snapshots=False)
    g.reserve(timeout_s=1)
    g.release()
    assert removed == [set()]
