"""In-memory snapshots of a world on several nodes: each node's host memory is a folder of
its own (here one folder per pair of ranks). A snapshot leaves every node's files on a
peer too, so a restore after losing a node's folder finds them all, in the old layout or
resharded into a smaller world, and fills a fresh node's folder before it reads."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard, distribute_tensor

from tests.dist.ranks import on_ranks
from shardline.workers.contract.events import RESTORED_METRICS, Event, EventKind
from shardline.workers.engine.checkpoint.spread import SnapshotSpread
from shardline.workers.engine.checkpoint.memory_tier import MemoryTier
from shardline.workers.engine.checkpoint.storage_tier import StorageTier
from shardline.workers.storage.checkpoints import MANIFEST, CheckpointStore
from shardline.workers.storage.layout import CheckpointLocations
from shardline.workers.storage.snapshots import private_snapshot_dir

ROWS = 64


def _full(step: int) -> torch.Tensor:
    return torch.arange(ROWS * 4, dtype=torch.float32).reshape(ROWS, 4) * step


def _tier(folder: str, events: list[Event]) -> MemoryTier:
    private_snapshot_dir(Path(folder))
    return MemoryTier(
        CheckpointStore(folder),
        info={"layout": "test"},
        on_report=events.append,  # what the job's events are told
    )


def _save(folders: list[str], rank: int, world: int, device: torch.device) -> list[Any]:
    mesh = init_device_mesh("cpu", (world,))
    events: list[Event] = []
    tier = _tier(folders[rank], events)
    for step in (2, 4):
        weight = distribute_tensor(_full(step), mesh, [Shard(0)])
        logged = {"step": step, "loss": 1 / step}  # the step's metrics, as the manager adds
        tier.save(step, {"w": weight}, {"step": step, RESTORED_METRICS: logged})
        tier.wait()
    return [(e.kind.value, e.data) for e in events]


def _no_room(path: str) -> Any:
    raise OSError(28, "No space left on device", path)


def _save_once_failing(folders: list[str], rank: int, world: int, device: torch.device) -> Any:
    """Rank 2 (node b's leader) cannot write what node a sends it at the first snapshot."""
    if rank == 2:
        SnapshotSpread._open_for_writing = staticmethod(_no_room)  # type: ignore[method-assign]
    said = _save(folders, rank, world, device)
    return said, sorted(p.name for p in Path(folders[rank]).iterdir() if p.name.startswith("step"))


def _restore(folders: list[str], rank: int, world: int, device: torch.device) -> Any:
    mesh = init_device_mesh("cpu", (world,))
    events: list[Event] = []
    memory = _tier(folders[rank], events)
    storage = StorageTier(None, keep_last=1, async_save=False, info={}, on_event=events.append)
    where = CheckpointLocations(save_url=None, restore_from=(), snapshot_url=folders[rank])

    def template(manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"w": distribute_tensor(torch.zeros(ROWS, 4), mesh, [Shard(0)])}

    found = storage.restore(where, template, memory)
    if found is None:
        return None
    ckpt, state = found
    restored = [e.data for e in events if e.kind == EventKind.RESTORED]
    weight = state["w"]
    assert isinstance(weight, DTensor)
    return ckpt.step, weight.full_tensor(), restored


def _files(folder: Path, step: int) -> set[str]:
    return {p.name for p in (folder / f"step-{step:08d}").iterdir()}


def test_a_lost_node_costs_nothing_of_the_newest_snapshot(tmp_path: Path) -> None:
    node_a, node_b, node_c = (str(tmp_path / name / "job") for name in ("a", "b", "c"))
    said = on_ranks(functools.partial(_save, [node_a, node_a, node_b, node_b]), 4)

    # Each node keeps only the newest snapshot, whole: its own ranks' files and the other's.
    for node in (node_a, node_b):
        assert [p.name for p in Path(node).glob("step-*")] == ["step-00000004"]
        names = _files(Path(node), 4)
        assert {"__0_0.distcp", "__1_0.distcp", "__2_0.distcp", "__3_0.distcp"} <= names
        assert {".metadata", MANIFEST} <= names
    (memory,) = [data for kind, data in said[0] if kind == EventKind.SNAPSHOT_MEMORY]
    assert memory["folders"] == [[0, 1], [2, 3]]
    assert all(held > ROWS * 4 * 4 for held in memory["bytes"]), memory

    # Node b dies with its host memory. A world of two ranks on node a reshards from it.
    for path in Path(node_b).rglob("*"):
        if path.is_file():
            path.unlink()
    smaller = on_ranks(functools.partial(_restore, [node_a, node_a]), 2)
    for step, weight, restored in smaller:
        assert step == 4
        torch.testing.assert_close(weight, _full(4), rtol=0, atol=0)
    assert smaller[0][2][0]["tier"] == "memory"
    # The restore event carries the step's metrics: rank 0 may have died before logging them.
    assert smaller[0][2][0][RESTORED_METRICS] == {"step": 4, "loss": 0.25}

    # Four ranks again, two on a fresh node c: its folder is filled from node a first.
    again = on_ranks(functools.partial(_restore, [node_a, node_a, node_c, node_c]), 4)
    for step, weight, _ in again:
        assert step == 4
        torch.testing.assert_close(weight, _full(4), rtol=0, atol=0)
    assert _files(Path(node_c), 4) == _files(Path(node_a), 4)


def test_a_node_that_cannot_take_its_copy_fails_that_snapshot_on_every_rank(
    tmp_path: Path,
) -> None:
    node_a, node_b = (str(tmp_path / name / "job") for name in ("a", "b"))
    # Without agreement the ranks that could write would wait for ever in the next
    # collective (on_ranks' timeout fails the test); rank 2 keeps failing here.
    got = on_ranks(functools.partial(_save_once_failing, [node_a, node_a, node_b, node_b]), 4, 120)
    said, folders = zip(*got, strict=True)
    failed = [data for kind, data in said[0] if kind == EventKind.SAVE_FAILED]
    assert [f["step"] for f in failed] == [2], said[0]  # said once, though both failed
    assert all(f == [] for f in folders), folders  # nothing committed, no staging left
    assert not [p for n in (node_a, node_b) for p in Path(n).glob(".staging-*")]
    assert not list(Path(node_b).rglob("*.partial"))


def test_a_snapshot_missing_a_file_on_every_node_is_not_restored(tmp_path: Path) -> None:
    node_a, node_b = (str(tmp_path / name / "job") for name in ("a", "b"))
    on_ranks(functools.partial(_save, [node_a, node_a, node_b, node_b]), 4)
    for node in (node_a, node_b):  # both copies of rank 3's shard are gone
        (Path(node) / "step-00000004" / "__3_0.distcp").unlink()
    assert on_ranks(functools.partial(_restore, [node_a, node_a, node_b, node_b]), 4) == [None] * 4


def test_snapshots_newer_than_the_restored_step_are_dropped(
    tmp_path: Path, one_rank_world: torch.device
) -> None:
    # A run that restored step 4 (a storage checkpoint, say) gives up the later snapshot
    # of the timeline it left: kept, it would outrank and prune each new one.
    store = CheckpointStore(str(tmp_path / "job"))
    private_snapshot_dir(tmp_path / "job")
    for step in (4, 9):
        Path(store.staging_path(step)).mkdir(parents=True)
        store.commit(step, {}, {})
    spread = SnapshotSpread(store, None)
    spread.forget_after(4)
    assert [c.step for c in store.committed()] == [4]
    spread.forget_after(0)  # a fresh start: none is of this run
    assert store.committed() == []
