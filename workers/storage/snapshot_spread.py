"""Which host-memory folders a job's ranks share, and which snapshot files must move
between them: a copy of every node's part on the next node after each snapshot, and the
missing parts onto every node before a restore.

A snapshot is written into each node's own host memory (`/dev/shm`), which dies with the
node. Ranks that see the same folder form one *folder group*; its lowest rank is the
group's *leader* and moves files for it. After a snapshot, each group's files go to the
next group's leader (a ring), so losing any one node leaves every file on some node
alive. Before a restore, every leader fetches what its folder lacks from a leader that
has it, so DCP can read any shard (a resharding restore reads other ranks' files).

No torch here: the planning is pure; workers/engine/checkpoint/spread.py moves the bytes.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# A file in each job's snapshot folder, named for the folder rather than the host: two
# Ray nodes on one machine may each have their own host memory (and two ranks on one node
# always share it), which no host name or address tells apart.
IDENTITY = ".folder-id"
METADATA = ".metadata"  # DCP's index, written by rank 0 alone


def folder_identity(folder: Path) -> str:
    """This folder's identity, made by the first rank to ask; every rank that sees the
    same folder reads the same one."""
    marker = folder / IDENTITY
    with contextlib.suppress(FileNotFoundError):
        return marker.read_text()
    mine = folder / f"{IDENTITY}.{uuid.uuid4().hex}"
    mine.write_text(uuid.uuid4().hex)
    try:
        os.link(mine, marker)  # atomic, and fails where another rank got there first
    except FileExistsError:
        pass
    finally:
        mine.unlink()
    return marker.read_text()


@dataclass(frozen=True)
class Transfer:
    """One file of a snapshot step, from a rank that has it to a rank that lacks it."""

    src: int
    dst: int
    name: str


@dataclass(frozen=True)
class FolderGroups:
    """The world's ranks by the folder they share, ordered by their lowest rank."""

    groups: tuple[tuple[int, ...], ...]

    @classmethod
    def from_identities(cls, identities: list[str]) -> FolderGroups:
        by_folder: dict[str, list[int]] = {}
        for rank, identity in enumerate(identities):
            by_folder.setdefault(identity, []).append(rank)
        return cls(tuple(sorted(tuple(ranks) for ranks in by_folder.values())))

    @property
    def leaders(self) -> tuple[int, ...]:
        return tuple(group[0] for group in self.groups)

    @property
    def spread(self) -> bool:
        """Whether the ranks write into more than one folder (more than one node)."""
        return len(self.groups) > 1

    def group_of(self, rank: int) -> tuple[int, ...]:
        return next(group for group in self.groups if rank in group)

    def is_leader(self, rank: int) -> bool:
        return rank in self.leaders


def written_by(name: str) -> int | None:
    """The rank that wrote one of DCP's files (`__<rank>_<n>.distcp`; `.metadata` is rank
    0's), or None for a file that is no rank's."""
    if name == METADATA:
        return 0
    if name.startswith("__"):
        head = name[2:].split("_", 1)[0]
        if head.isdigit():
            return int(head)
    return None


def replication_plan(groups: FolderGroups, names: list[str]) -> list[Transfer]:
    """After a snapshot: each group's files (`names`, all the world's) to the next group's
    leader, so every file is on two nodes. Nothing where the world shares one folder."""
    if not groups.spread:
        return []
    leaders = groups.leaders
    plan: list[Transfer] = []
    for index, group in enumerate(groups.groups):
        target = leaders[(index + 1) % len(leaders)]
        plan.extend(
            Transfer(group[0], target, name) for name in sorted(names) if written_by(name) in group
        )
    return plan


@dataclass(frozen=True)
class Listing:
    """One committed snapshot step as one leader's folder holds it."""

    step: int
    manifest: dict[str, Any]
    present: frozenset[str]


def restore_plan(
    groups: FolderGroups, listings: dict[int, list[Listing]]
) -> list[tuple[dict[str, Any], list[Transfer]]]:
    """Snapshot steps a restore may use, newest first: each with its manifest and the
    transfers that give every leader's folder all its files. `listings` are each leader's
    committed steps. A step whose files are not all on some live node is left out."""
    # One save is one (step, save id): the same step saved in two timelines is two.
    saves: dict[tuple[int, str], dict[int, Listing]] = {}
    for leader, found in listings.items():
        for listing in found:
            key = (listing.step, str(listing.manifest.get("save_id", "")))
            saves.setdefault(key, {})[leader] = listing
    out = []
    newest_first = sorted(saves, key=lambda k: (k[0], _committed_at(saves[k])), reverse=True)
    for key in newest_first:
        holders = saves[key]
        manifest = holders[min(holders)].manifest
        plan = _fill(groups.leaders, holders, set(manifest["files"]))
        if plan is not None:
            out.append((manifest, plan))
    return out


def _committed_at(holders: dict[int, Listing]) -> float:
    return max(float(h.manifest.get("committed_at", 0.0)) for h in holders.values())


def _fill(
    leaders: tuple[int, ...], holders: dict[int, Listing], wanted: set[str]
) -> list[Transfer] | None:
    """What each leader lacks of `wanted`, from the lowest leader that has it; None where
    some file is on no live node."""
    plan = []
    for leader in leaders:
        have = holders[leader].present if leader in holders else frozenset()
        for name in sorted(wanted - have):
            source = next((h for h in sorted(holders) if name in holders[h].present), None)
            if source is None:
                return None
            plan.append(Transfer(source, leader, name))
    return plan
