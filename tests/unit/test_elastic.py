"""Elastic re-planning, waiting for capacity and bad nodes: decisions, against fakes."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any

import pytest

from shardline.workers.contract.demand import admission_demand, elastic_min_ranks, job_demand
from shardline.workers.contract.planner import default_rates, plan
from shardline.workers.contract.spec import JobSpec
from shardline.workers.runtime.placement import elastic
from shardline.workers.runtime.placement.elastic import describe_layout, next_smaller, replan
from shardline.workers.runtime.placement.node_health import NodeHealth
from shardline.workers.runtime.placement.reservation import reserve_placement


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


def test_a_re_plan_keeps_the_global_batch_and_skips_rank_counts_with_no_layout() -> None:
    # 8 rows: no layout of the tiny model has 3 ranks (dp 3 does not divide the batch, nor
    # 3 its heads or layers), so a dp=4 job goes on with 2.
    full = spec(dp=4, min_dp=1)
    shrunk = next_smaller(full, full)
    assert shrunk is not None and shrunk.parallel.world_size == 2
    assert shrunk.train.global_batch_size == full.train.global_batch_size
    assert next_smaller(spec(dp=4, min_dp=None), spec(dp=4, min_dp=None)) is None  # not elastic


def test_min_dp_bounds_the_ranks_not_each_layouts_dp() -> None:
    full = spec(dp=2, tp=2, min_dp=2)  # at least 2 x tp=2 = 4 ranks
    assert elastic_min_ranks(full) == 4 and next_smaller(full, full) is None
    full = spec(dp=2, tp=2, min_dp=1)
    assert elastic_min_ranks(full) == 2
    shrunk = next_smaller(full, full)
    assert shrunk is not None and shrunk.parallel.world_size == 2


def test_the_re_plan_is_the_planners_fastest_and_may_change_more_than_dp() -> None:
    full = spec(dp=2, tp=2, min_dp=1)
    shrunk = replan(full, 2)
    assert shrunk is not None
    best = plan(full, 2, default_rates(full))[0].spec
    assert shrunk.parallel == best.parallel and shrunk.train == best.train
    # On this CPU's rates the tiny model runs faster data parallel than tensor parallel.
    assert (shrunk.parallel.dp, shrunk.parallel.tp) == (2, 1)
    assert describe_layout(shrunk) == "dp=2 tp=1 pp=1 (2 ranks)"


def test_a_re_plan_never_returns_a_layout_that_does_not_fit_the_device(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """On a device whose memory holds the model over 4 ranks but not over 2, a 4-rank job
    that loses 2 does not go on at 2: there are legal 2-rank layouts, none fits."""
    full = spec(dp=4, min_dp=1)
    rates = default_rates(full)
    smallest = {
        ranks: min(p.predicted.peak_bytes_per_rank for p in plan(full, ranks, rates))
        for ranks in (2, 4)
    }
    assert smallest[4] < smallest[2]
    device = dataclasses.replace(rates, device_memory=smallest[2] - 1)
    monkeypatch.setattr(elastic, "planning_rates", lambda _spec: device)
    assert plan(full, 2, device)  # legal layouts exist ...
    assert replan(full, 2) is None  # ... and none fits
    assert next_smaller(full, full) is None
    on_four = replan(full, 4)
    assert on_four is not None and on_four.parallel.world_size == 4


def test_an_elastic_job_is_admitted_on_its_fewest_ranks() -> None:
    full = spec(dp=2, tp=2, min_dp=1)
    assert job_demand(full)["CPU"] == 4 and admission_demand(full)["CPU"] == 2
    assert admission_demand(full)["memory"] < job_demand(full)["memory"]
    fixed = spec(dp=4, min_dp=None)
    assert admission_demand(fixed) == job_demand(fixed)


def test_min_dp_above_dp_is_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match=r"fault_tolerance\.elastic\.min_dp=8"):
        spec(dp=4, min_dp=8)


class FakeGroup:
    """Ranks fit only at or below `room` ranks; `lost`: a node of the last placement is
    dead."""

    def __init__(self, room: int, lost: bool = False) -> None:
        self.room = room
        self.lost = lost
        self.world_size = 0
        self.resized: list[int] = []

    def reserve(self, timeout_s: float) -> list[str]:
        if self.world_size and self.world_size <= self.room:
            return ["node-a"] * self.world_size
        time.sleep(timeout_s)
        raise TimeoutError("placement group not ready")

    def resize(self, spec: JobSpec) -> None:
        self.world_size = spec.parallel.world_size
        self.resized.append(spec.parallel.world_size)

    def has_room_for(self, spec: JobSpec) -> bool:
        return spec.parallel.world_size <= self.room

    def lost_a_node(self) -> bool:
        return self.lost


def test_an_elastic_job_that_cannot_get_its_ranks_goes_on_with_fewer() -> None:
    group, events = FakeGroup(room=2), []
    group.world_size = 4
    placed = reserve_placement(
        group,
        spec(dp=4),
        spec(dp=4),
        cancelled=lambda: False,
        on_event=lambda event: events.append(event.message),
        elastic_wait_s=0.05,
        chunk_s=0.01,
    )
    assert placed is not None
    nodes, layout = placed
    assert (len(nodes), layout.parallel.world_size, group.resized) == (2, 2, [2])
    assert any(
        e.startswith("elastic re-plan: dp=4 tp=1 pp=1 (4 ranks)") and "(2 ranks)" in e
        for e in events
    ), events


def test_a_dead_node_under_the_job_re_plans_without_waiting_for_the_old_size() -> None:
    took = {}
    for lost in (False, True):
        group = FakeGroup(room=2, lost=lost)
        group.world_size = 4
        started = time.monotonic()
        placed = reserve_placement(
            group,
            spec(dp=4),
            spec(dp=4),
            cancelled=lambda: False,
            on_event=lambda event: None,
            elastic_wait_s=1.0,
            chunk_s=0.01,
        )
        assert placed is not None and placed[1].parallel.world_size == 2
        took[lost] = time.monotonic() - started
    assert took[False] >= 1.0 and took[True] < 0.5, took


def test_without_elastic_it_waits_for_capacity_and_cancel_ends_the_wait() -> None:
    group, events = FakeGroup(room=2), []
    group.world_size = 4
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    started = time.monotonic()
    placed = reserve_placement(
        group,
        spec(dp=4, min_dp=None),
        spec(dp=4, min_dp=None),
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
