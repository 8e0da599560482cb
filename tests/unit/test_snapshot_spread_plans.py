"""The plans behind snapshots on several nodes: a ring of copies after each snapshot, and
what each node must fetch before a restore (workers/storage/snapshot_spread.py)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from shardline.workers.storage.snapshot_spread import (
    FolderGroups,
    Listing,
    folder_identity,
    replication_plan,
    restore_plan,
    written_by,
)

# Three nodes of two ranks each.
GROUPS = FolderGroups.from_identities(["a", "a", "b", "b", "c", "c"])
FILES = [".metadata"] + [f"__{r}_0.distcp" for r in range(6)]


def test_ranks_that_share_a_folder_form_a_group_led_by_their_lowest_rank() -> None:
    groups = FolderGroups.from_identities(["x", "y", "x", "y"])
    assert groups.groups == ((0, 2), (1, 3))
    assert groups.leaders == (0, 1)
    assert groups.spread and not FolderGroups.from_identities(["x", "x"]).spread


def test_dcp_files_are_told_apart_by_the_rank_that_wrote_them() -> None:
    assert written_by("__12_0.distcp") == 12
    assert written_by(".metadata") == 0
    assert written_by("manifest.json") is None


def test_each_node_copies_its_files_to_the_next_node() -> None:
    plan = replication_plan(GROUPS, FILES)
    assert {(t.src, t.dst) for t in plan} == {(0, 2), (2, 4), (4, 0)}
    assert sorted(t.name for t in plan if t.src == 0) == [
        ".metadata",
        "__0_0.distcp",
        "__1_0.distcp",
    ]
    assert sorted(t.name for t in plan if t.src == 4) == ["__4_0.distcp", "__5_0.distcp"]
    assert replication_plan(FolderGroups.from_identities(["a", "a"]), FILES) == []


def _after_ring(step: int) -> dict[int, Listing]:
    """Each leader's folder after a snapshot and its ring copy."""
    manifest = {"step": step, "files": {name: {} for name in FILES}}
    own = {
        0: {".metadata", "__0_0.distcp", "__1_0.distcp"},
        2: {"__2_0.distcp", "__3_0.distcp"},
        4: {"__4_0.distcp", "__5_0.distcp"},
    }
    previous = {0: 4, 2: 0, 4: 2}
    return {
        leader: Listing(step, manifest, frozenset(own[leader] | own[previous[leader]]))
        for leader in own
    }


def test_after_losing_a_node_the_others_hold_every_file_and_fill_each_other() -> None:
    held = _after_ring(6)
    del held[2]  # node b is lost
    # The world after the loss: two groups, led by ranks 0 and 4 (same folders as before).
    groups = FolderGroups(((0, 1, 2), (4, 5, 3)))
    ((manifest, plan),) = restore_plan(groups, {0: [held[0]], 4: [held[4]]})
    assert manifest["step"] == 6
    # Node a held its own and c's: it lacks b's, which c copied. Node c lacks a's own.
    assert sorted((t.src, t.dst, t.name) for t in plan) == [
        (0, 4, ".metadata"),
        (0, 4, "__0_0.distcp"),
        (0, 4, "__1_0.distcp"),
        (4, 0, "__2_0.distcp"),
        (4, 0, "__3_0.distcp"),
    ]


def test_a_step_no_live_node_holds_whole_is_not_a_candidate() -> None:
    held = _after_ring(6)
    newer = _after_ring(8)
    del newer[2], newer[4]  # step 8 is only on node a, which lacks c's own files
    listings = {leader: [newer[leader]] if leader in newer else [] for leader in (0, 2, 4)}
    for leader in listings:
        listings[leader].append(held[leader])
    found = restore_plan(GROUPS, listings)
    assert [m["step"] for m, _ in found] == [6]
    # Each node holds its own files and its previous node's; it fetches the next one's,
    # from the lowest rank that has them.
    assert sorted((t.src, t.dst, t.name) for t in found[0][1]) == [
        (0, 2, "__4_0.distcp"),
        (0, 2, "__5_0.distcp"),
        (0, 4, ".metadata"),
        (0, 4, "__0_0.distcp"),
        (0, 4, "__1_0.distcp"),
        (2, 0, "__2_0.distcp"),
        (2, 0, "__3_0.distcp"),
    ]


def test_every_rank_of_a_folder_reads_one_identity(tmp_path: Path) -> None:
    seen: list[str] = []
    threads = [
        threading.Thread(target=lambda: seen.append(folder_identity(tmp_path))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(seen)) == 1 and len(seen[0]) == 32
    assert [p.name for p in tmp_path.iterdir()] == [".folder-id"]


def test_the_same_step_from_two_saves_is_never_mixed() -> None:
    groups = FolderGroups.from_identities(["a", "b"])
    files: dict[str, Any] = {"__0_0.distcp": {}, "__1_0.distcp": {}}

    def held(save: str, names: set[str]) -> list[Listing]:
        manifest = {"step": 4, "files": files, "save_id": save}
        return [Listing(4, manifest, frozenset(names))]

    # Node a's step 4 is from a timeline given up; node b's from this one: neither whole.
    split = {0: held("old", {"__0_0.distcp"}), 1: held("new", {"__1_0.distcp"})}
    assert restore_plan(groups, split) == []
    same = {0: held("new", {"__0_0.distcp"}), 1: held("new", {"__1_0.distcp"})}
    assert [m["save_id"] for m, _ in restore_plan(groups, same)] == ["new"]
