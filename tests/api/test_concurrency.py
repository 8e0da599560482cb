"""Jobs are never duplicated, and two writers racing on one job cannot both win."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any, cast

import httpx
import pytest
from sqlalchemy import event

from shardline.service.db import Database
from shardline.service.store import ConcurrentUpdate, IllegalTransition, JobStore
from shardline.workers.contract.lifecycle import JobState
from tests.api.conftest import Backend
from tests.support.event_loops import run_async

# How many submits must be inside the store at the same moment, each having found no job
# for the key, so that all but one take the duplicate-key (IntegrityError) path.
RACERS = 4


def test_50_concurrent_submits_with_one_key_create_one_job(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, token = backend.new_user()
    headers = {"Authorization": f"Bearer {token}", "Idempotency-Key": "same-key"}
    body = {"name": "once", "train": {"steps": 3}}
    # Hold the first RACERS key lookups of the real server's store, each done, until all have
    # arrived. If submits ran one at a time (a blocking store call on the event loop) the
    # barrier could never fill and would break after its timeout.
    store = cast(JobStore, backend.server.app.state.store)
    lookup = store._by_key
    barrier = threading.Barrier(RACERS, timeout=30)
    calls: list[int] = []
    lock = threading.Lock()

    def held_lookup(owner_id: int, key: str) -> Any:
        with lock:
            calls.append(owner_id)
            held = len(calls) <= RACERS
        found = lookup(owner_id, key)
        if held:
            # After the lookup: each racer has found no job before any of them inserts.
            with contextlib.suppress(threading.BrokenBarrierError):
                barrier.wait()
        return found

    monkeypatch.setattr(store, "_by_key", held_lookup)

    async def submit_all() -> list[httpx.Response]:
        async with httpx.AsyncClient(base_url=backend.server.url, timeout=120) as http:
            return await asyncio.gather(
                *[http.post("/v1/jobs", json=body, headers=headers) for _ in range(50)]
            )

    responses = run_async(submit_all)
    assert not barrier.broken, f"{RACERS} submits were never inside the store at once"
    # Every racer but the winner (and any submit that overlapped them) hit the unique
    # constraint and looked the key up again.
    assert len(calls) >= 50 + RACERS - 1, len(calls)
    assert all(r.status_code in (200, 201) for r in responses), [r.text for r in responses]
    assert sum(r.status_code == 201 for r in responses) == 1
    assert len({r.json()["id"] for r in responses}) == 1
    with backend.client(token) as c:
        assert len(c.list()["jobs"]) == 1


def test_same_key_with_another_body_is_a_conflict(backend: Backend) -> None:
    _, token = backend.new_user()
    with backend.client(token) as c:
        first = c.submit({"name": "a"}, idempotency_key="k1")
        assert c.submit({"name": "a"}, idempotency_key="k1")["id"] == first["id"]
    response = httpx.post(
        f"{backend.server.url}/v1/jobs",
        json={"name": "b"},
        headers={"Authorization": f"Bearer {token}", "Idempotency-Key": "k1"},
    )
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_conflict"
    # Keys are per owner: another user may use the same key for their own job.
    _, other = backend.new_user()
    with backend.client(other) as c:
        assert c.submit({"name": "b"}, idempotency_key="k1")["id"] != first["id"]


def _race(store: JobStore, job_id: str, version: int) -> dict[str, Any]:
    """Two threads move one job, from the same read, to two different states at once."""
    return _together(
        store,
        {
            to.value: functools.partial(
                store.transition, job_id, to, f"race to {to.value}", expected_version=version
            )
            for to in (JobState.STARTING, JobState.CANCELLING)
        },
    )


def _together(store: JobStore, calls: Mapping[str, Callable[[], Any]]) -> dict[str, Any]:
    """Each call in a thread of its own; what each returned (a job's state) or raised.

    All are held just before their UPDATE until the others get there too, so the losers
    are stopped by the compare-and-swap itself, not by an earlier read that saw the
    winner's commit.
    """
    at_update = threading.Barrier(len(calls), timeout=30)
    outcomes: dict[str, Any] = {}

    def hold_updates(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE JOBS"):
            at_update.wait()

    def call(name: str) -> None:
        try:
            outcomes[name] = calls[name]().state
        except (ConcurrentUpdate, IllegalTransition, threading.BrokenBarrierError) as err:
            outcomes[name] = err

    event.listen(store.db.engine, "before_cursor_execute", hold_updates)
    try:
        threads = [threading.Thread(target=call, args=(name,)) for name in calls]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        event.remove(store.db.engine, "before_cursor_execute", hold_updates)
    assert not at_update.broken, f"the threads did not all reach the UPDATE: {outcomes}"
    return outcomes


def test_two_concurrent_conflicting_transitions_exactly_one_wins(backend: Backend) -> None:
    # A store of its own: the UPDATE hook must not hold the server's writes.
    db = Database(backend.url)
    store = JobStore(db)
    user = backend.users.ensure_user(backend.new_user()[0])
    try:
        for _ in range(5):
            job, _ = store.create(user, _spec())
            outcomes = _race(store, job.id, job.version)
            winners = [v for v in outcomes.values() if isinstance(v, str)]
            losers = [v for v in outcomes.values() if isinstance(v, Exception)]
            assert len(winners) == 1 and len(losers) == 1, outcomes
            assert isinstance(losers[0], ConcurrentUpdate)
            assert "changed while moving it" in str(losers[0])  # lost at the CAS itself
            final = store.get(job.id)
            assert final.state == winners[0] and final.version == job.version + 1
            state_events = [e for e in store.events(job.id) if e.kind == "state"]
            assert len(state_events) == 1
    finally:
        db.dispose()


def test_racing_pauses_and_racing_resumes_each_answer_with_the_one_move(
    backend: Backend,
) -> None:
    db = Database(backend.url)  # a store of its own: the UPDATE hook must not hold the server
    store = JobStore(db)
    user = backend.users.ensure_user(backend.new_user()[0])
    try:
        job, _ = store.create(user, _spec())
        store.transition(job.id, JobState.STARTING, "admitted")
        store.transition(job.id, JobState.RUNNING, "trains")
        pauses = {
            f"pause {i}": functools.partial(store.request_pause, job.id, user, "p")
            for i in range(3)
        }
        assert set(_together(store, pauses).values()) == {JobState.PAUSING}
        store.transition(job.id, JobState.PAUSED, "checkpointed")
        resumes = {
            f"resume {i}": functools.partial(store.request_resume, job.id, user, "r")
            for i in range(3)
        }
        assert set(_together(store, resumes).values()) == {JobState.QUEUED}
        moves = [
            (e.data["from"], e.data["to"])
            for e in store.events(job.id)
            if e.kind == "state" and e.data is not None
        ]
        assert moves == [
            ("QUEUED", "STARTING"),
            ("STARTING", "RUNNING"),
            ("RUNNING", "PAUSING"),
            ("PAUSING", "PAUSED"),
            ("PAUSED", "QUEUED"),
        ]
    finally:
        db.dispose()


def test_illegal_edges_are_refused(backend: Backend) -> None:
    store = JobStore(backend.db)
    user = backend.users.ensure_user(backend.new_user()[0])
    job, _ = store.create(user, _spec())
    with pytest.raises(IllegalTransition, match="QUEUED; it cannot become SUCCEEDED"):
        store.transition(job.id, JobState.SUCCEEDED, "skip ahead")
    with pytest.raises(ConcurrentUpdate):
        store.transition(job.id, JobState.STARTING, "stale", expected_version=job.version - 1)
    assert store.get(job.id).state == "QUEUED"


def _spec() -> Any:
    from shardline.workers.contract.spec import JobSpec

    return JobSpec.model_validate({"name": "race"})
