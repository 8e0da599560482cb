"""What each node holds, from Ray's node list and placement group table as Ray returns
them (the shapes are copied from ray.nodes() and placement_group_table() on Ray 2.60)."""

from __future__ import annotations

from shardline.service.cluster_view import Holding, nodes_view


def node(node_id: str, address: str, cpus: float, alive: bool = True) -> dict[str, object]:
    return {
        "NodeID": node_id,
        "Alive": alive,
        "NodeManagerAddress": address,
        "Resources": {
            f"node:{address}": 1.0,
            "CPU": cpus,
            "memory": 4e9,
            "object_store_memory": 1e9,
        },
    }


def group(name: str, state: str, placed: dict[int, str]) -> dict[str, object]:
    return {
        "name": name,
        "state": state,
        "bundles": {i: {"CPU": 1.0, "memory": 1e8} for i in placed},
        "bundles_to_node_id": placed,
    }


def test_each_node_lists_the_ranks_each_job_holds_there() -> None:
    nodes = [node("b", "10.0.0.2", 4, alive=False), node("a", "10.0.0.1", 8)]
    groups = {
        "pg1": group("shardline-job-j1", "CREATED", {0: "a", 1: "a", 2: "b"}),
        "pg2": group("shardline-job-j2", "PENDING", {}),  # not placed yet: holds nothing
        "pg4": group("shardline-job-j3", "REMOVED", {0: "a"}),  # given back: nothing either
        "pg3": group("someone-else", "CREATED", {0: "a"}),  # not this service's
    }
    a, b = nodes_view(nodes, groups)
    assert (a.node_id, a.alive, a.resources) == ("a", True, {"CPU": 8.0, "memory": 4e9})
    assert a.held == [Holding("j1", 2, {"CPU": 2.0, "memory": 2e8})]
    assert (b.node_id, b.alive) == ("b", False)  # a dead node comes last
    assert b.held == [Holding("j1", 1, {"CPU": 1.0, "memory": 1e8})]
