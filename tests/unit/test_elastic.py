"""Elastic re-planning, waiting for capacity and bad nodes: decisions, against fakes."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from workers.contract.spec import JobSpec
from workers.runtime.placement.elastic import smaller_layouts, with_dp
from workers.runtime.placement.node_health import NodeHealth
from workers.runtime.placement.reservation import reserve_placement


def spec(dp: int = 4, min_dp: int | None = 1, global_batch: int = 8, **parallel: Any) -> JobSpec:
    ft: dict[str, Any] = {} if min_dp is None else {"elastic": {"min_dp": min_dp}}
    return JobSpec.model_validate(
        {
            "name": "elastic",
            "model": {"preset": "tiny", "seq_len": 32},
            "parallel": {"dp": dp, **parallel},
            "train": {"global_batch_size": global_batch, "micro_batch_size": 1},
            "fault_tolerance": ft,
        }
    )


def test_shrinks_only_to_degrees_that_keep_the_global_batch() -> None:
    # 12 rows: dp 6, 4, 3, 2, 1 divide it; 5 does not.
    assert smaller_layouts(spec(dp=6, global_batch=12), 6) == [4, 3, 2, 1]
    assert smaller_layouts(spec(dp=6, min_dp=3, global_batch=12), 6) == [4, 3]
    assert smaller_layouts(spec(dp=4, min_dp=None), 4) == []  # not elastic


def test_a_shrunk_layout_keeps_tp_pp_and_the_global_batch() -> None:
    full = spec(dp=4, tp=2)
    half = with_dp(full, 2)
    assert (half.parallel.dp, half.parallel.tp, half.parallel.world_size) == (2, 2, 4)
    assert half.train.global_batch_size == full.train.global_batch_size
    assert half.accumulation_steps == 2 * full.accumulation_steps


def test_min_dp_above_dp_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"fault_tolerance\.elastic\.min_dp=8"):
        spec(dp=4, min_dp=8)


class FakeGroup:
    """Ranks fit only at or below `room` data-parallel ranks (tp=pp=1 here)."""

    def __init__(self, room: int) -> None:
        self.room = room
        self.world_size = 0
        self.resized: list[int] = []

    def reserve(self, timeout_s: float) -> list[str]:
        if self.world_size and self.world_size <= self.room:
            return ["node-a"] * self.world_size
        time.sleep(timeout_s)
        raise TimeoutError("placement group not ready")

    def resize(self, spec: JobSpec) -> None:
        self.world_size = spec.parallel.world_size
        self.resized.append(spec.parallel.dp)

    def has_room_for(self, spec: JobSpec) -> bool:
        return spec.parallel.world_size <= self.room


def test_an_elastic_job_that_cannot_get_its_ranks_goes_on_with_fewer() -> None:
    group, events = FakeGroup(room=2), []
    group.world_size = 4
    placed = reserve_placement(
        group,
        spec(dp=4),
        4,
        cancelled=lambda: False,
        on_event=lambda event: events.append(event.message),
        elastic_wait_s=0.05,
        chunk_s=0.01,
    )
    assert placed is not None
    nodes, layout = placed
    assert (len(nodes), layout.parallel.dp, group.resized) == (2, 2, [2])
    assert any("elastic re-plan: dp=4" in e and "dp=2" in e for e in events), events


def test_without_elastic_it_waits_for_capacity_and_cancel_ends_the_wait() -> None:
    group, events = FakeGroup(room=2), []
    group.world_size = 4
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    placed = reserve_placement(
        group,
        spec(dp=4, min_dp=None),
        4,
        cancelled=cancel.is_set,
        on_event=lambda event: events.append(event.message),
        elastic_wait_s=0.05,
        chunk_s=0.01,
    )
    assert placed is None and group.resized == []
    assert time.monotonic() - started < 5.0
    assert events == ["waiting for capacity: 4 ranks do not fit the cluster now"]


def test_a_node_is_bad_at_its_second_failure_for_the_job() -> None:
    health = NodeHealth()
    assert health.record(["n1", "n1", "n2"]) == []  # one failure, however many ranks
    assert health.record(["n1"]) == ["n1"]
    assert health.record(["n1"]) == []  # said once
    assert health.bad == {"n1"}
