"""The warm pool's bookkeeping, with its Ray calls replaced (one class, no cluster): the
Ray side is tests/e2e/test_warm_pool.py."""

from __future__ import annotations

from typing import Any

from shardline.workers.runtime.warm_pool import (
    MAX_JOBS_PER_WORKER,
    MAX_RECYCLED_BYTES,
    Idle,
    Readiness,
    Recycled,
    Returned,
    WarmPool,
)

FRESH = Recycled(jobs=1, resident_bytes=700 << 20)


def back(node: str, actor: Any, recycled: Recycled = FRESH) -> Returned:
    return Returned(node, actor, recycled)


class FakePool(WarmPool):
    def __init__(self, per_node: int, idle_s: float, nodes: set[str]) -> None:
        self.now = 0.0
        self.alive_nodes = nodes
        self.started: list[Idle] = []
        self.stopped: list[Any] = []
        self.state: dict[int, Readiness] = {}
        super().__init__(per_node, idle_s, clock=lambda: self.now, tick_s=None)

    def _start(self, node: str) -> Idle:
        entry = Idle(node, len(self.started), "its start")
        self.started.append(entry)
        self.state[entry.actor] = Readiness.STARTING
        return entry

    def _readiness(self, entry: Idle) -> Readiness:
        return self.state[entry.actor]

    def _stop(self, entry: Idle) -> None:
        self.stopped.append(entry.actor)

    def _nodes(self) -> set[str]:
        return set(self.alive_nodes)

    def all_ready(self) -> None:
        for actor in self.state:
            self.state[actor] = Readiness.READY


def test_fills_every_node_and_hands_out_the_asked_nodes_started_workers_first() -> None:
    pool = FakePool(2, 60.0, {"a", "b"})
    pool.maintain()
    assert sorted(e.node for e in pool.idle) == ["a", "a", "b", "b"]
    pool.state[1] = Readiness.READY  # the second on node a has started, the first not yet
    assert pool.take(["a"]) == [1]  # the started one
    pool.all_ready()
    taken = pool.take(["a", "a", "b"])
    assert taken[0] is not None and taken[1] is None and taken[2] is not None
    assert pool.started[taken[0]].node == "a" and pool.started[taken[2]].node == "b"
    # What was handed out is the job's, never stopped here; replacements wait until its
    # ranks train.
    assert pool.stopped == [] and [e.node for e in pool.idle] == ["b"]
    pool.now += 29.0
    pool.maintain()
    assert len(pool.idle) == 1
    pool.refill()
    assert sorted(e.node for e in pool.idle) == ["a", "a", "b", "b"]
    assert pool.counts() == {"ready": 1, "starting": 3, "handed_out": 3}


def test_only_started_workers_are_handed_out_and_replaced_once_the_job_trains() -> None:
    pool = FakePool(1, 60.0, {"a"})
    pool.maintain()
    assert pool.take(["a"]) == [None]  # still importing torch: the job starts its own
    pool.all_ready()
    assert pool.take(["a", "a"]) == [0, None]
    pool.now += 29.0
    pool.maintain()
    assert pool.idle == []
    pool.now += 1.0  # a job that never trains: its workers are replaced from now on anyway
    pool.maintain()
    assert len(pool.idle) == 1
    pool.state[1] = Readiness.DEAD
    assert pool.take(["a"]) == [None]


def test_drops_the_dead_and_those_on_lost_nodes_and_starts_others() -> None:
    pool = FakePool(1, 60.0, {"a", "b"})
    pool.maintain()
    pool.all_ready()
    on_a = next(e.actor for e in pool.idle if e.node == "a")
    pool.state[on_a] = Readiness.DEAD
    pool.alive_nodes = {"a"}
    pool.maintain()
    assert [(e.node, pool.state[e.actor]) for e in pool.idle] == [("a", Readiness.STARTING)]
    assert sorted(pool.stopped) == [0, 1]


def test_rests_after_idle_s_without_a_take_and_refills_at_the_next() -> None:
    pool = FakePool(2, 60.0, {"a"})
    pool.maintain()
    pool.now = 61.0
    pool.maintain()
    assert pool.idle == [] and sorted(pool.stopped) == [0, 1]
    pool.maintain()  # resting: nothing started
    assert len(pool.started) == 2
    assert pool.take(["a", "a"]) == [None, None]  # cold: the job starts its own
    pool.refill()
    assert len(pool.idle) == 2 and len(pool.started) == 4


def test_configure_resizes_and_zero_empties_it() -> None:
    pool = FakePool(2, 60.0, {"a"})
    pool.maintain()
    pool.configure(3, 60.0)
    assert len(pool.idle) == 3
    pool.configure(0, 60.0)
    assert pool.idle == [] and len(pool.stopped) == 3
    pool.close()
    pool.configure(2, 60.0)  # closed: stays empty
    assert pool.idle == []


def test_workers_given_back_go_first_in_line_and_the_newest_are_stopped() -> None:
    pool = FakePool(2, 60.0, {"a"})
    pool.maintain()
    taken = pool.take(["a", "a"])  # none started yet: nothing handed out
    assert taken == [None, None]
    pool.all_ready()
    held = pool.take(["a", "a"])
    pool.refill()  # the job trains: two replacements start
    assert [e.actor for e in pool.idle] == [2, 3]
    pool.give_back([back("a", held[0]), back("a", held[1])])  # its job ended cleanly
    # Those given back are ready at once and kept; the replacements still starting go.
    assert [e.actor for e in pool.idle] == held and pool.stopped == [2, 3]
    assert pool.counts()["ready"] == 2
    assert pool.take(["a"]) == [held[0]]


def test_workers_given_back_to_a_full_or_resting_pool_are_stopped() -> None:
    pool = FakePool(1, 60.0, {"a"})
    pool.maintain()
    pool.all_ready()
    (held,) = pool.take(["a"])
    pool.refill()
    pool.all_ready()
    pool.give_back([back("a", held), back("a", 99)])  # more than the node keeps: the rest stop
    assert [e.actor for e in pool.idle] == [held] and pool.stopped == [99, 1]
    pool.now += 61.0  # resting: anything given back stops, nothing starts
    pool.give_back([back("b", 7)])
    assert pool.idle == [] and set(pool.stopped[-2:]) == {held, 7}


def test_a_worker_worn_by_jobs_or_grown_large_is_stopped_and_replaced() -> None:
    """Reused processes grow with each job (686 -> ~800 MB over six tiny ones): one that
    has served its jobs, or holds more than the bound, is not kept but replaced."""
    pool = FakePool(2, 60.0, {"a"})
    pool.maintain()
    pool.all_ready()
    held = pool.take(["a", "a"])
    worn = Recycled(jobs=MAX_JOBS_PER_WORKER, resident_bytes=700 << 20)
    grown = Recycled(jobs=2, resident_bytes=MAX_RECYCLED_BYTES + 1)
    pool.give_back([back("a", held[0], worn), back("a", held[1], grown)])
    assert set(pool.stopped) == set(held) and pool.idle == []
    pool.refill()  # as the job's release then asks
    assert len(pool.idle) == 2 and all(e.actor not in held for e in pool.idle)
