"""The cluster as the cluster page shows it: each node's resources and which job's ranks
hold what there, read from Ray's node list and placement group table (what Ray has
actually reserved, not what the database believes). Pure: the Ray calls are the caller's."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from shardline.workers.contract.demand import RESOURCE_NAMES
from shardline.workers.runtime.names import PLACEMENT_GROUP_PREFIX


@dataclass(frozen=True)
class Holding:
    """What one job's ranks hold on one node."""

    job_id: str
    ranks: int
    resources: dict[str, float]


@dataclass(frozen=True)
class NodeInfo:
    node_id: str
    address: str
    alive: bool
    resources: dict[str, float]  # CPU, GPU and memory (bytes) the node offers
    held: list[Holding] = field(default_factory=list)


def _resources(raw: Mapping[str, Any]) -> dict[str, float]:
    return {k: float(raw[k]) for k in RESOURCE_NAMES if k in raw}


def nodes_view(nodes: Iterable[Mapping[str, Any]], groups: Mapping[str, Any]) -> list[NodeInfo]:
    """`nodes` as ray.nodes() gives them, `groups` as placement_group_table() does; live
    nodes first. Only this service's placement groups (named after their job) that Ray
    has placed count: one still pending or removed holds nothing."""
    held: dict[str, dict[str, Holding]] = {}
    for group in groups.values():
        name = str(group.get("name") or "")
        if not name.startswith(PLACEMENT_GROUP_PREFIX) or group.get("state") != "CREATED":
            continue
        job_id = name.removeprefix(PLACEMENT_GROUP_PREFIX)
        bundles = {str(k): v for k, v in (group.get("bundles") or {}).items()}
        for index, node_id in (group.get("bundles_to_node_id") or {}).items():
            on_node = held.setdefault(str(node_id), {})
            before = on_node.get(job_id, Holding(job_id, 0, {}))
            add = _resources(bundles.get(str(index), {}))
            total = {
                k: before.resources.get(k, 0.0) + add.get(k, 0.0) for k in before.resources | add
            }
            on_node[job_id] = Holding(job_id, before.ranks + 1, total)
    out = [
        NodeInfo(
            node_id=str(n["NodeID"]),
            address=str(n.get("NodeManagerAddress", "")),
            alive=bool(n.get("Alive")),
            resources=_resources(n.get("Resources") or {}),
            held=sorted(held.get(str(n["NodeID"]), {}).values(), key=lambda h: h.job_id),
        )
        for n in nodes
    ]
    return sorted(out, key=lambda n: (not n.alive, n.address, n.node_id))
