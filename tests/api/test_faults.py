"""The fault-injection route's guards, and what a recovery costs as GET /v1/jobs shows it,
on SQLite and PostgreSQL (a real server; no Ray: tests/e2e/test_faults.py has the faults
themselves)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from shardline.api.client import Client, Conflict, Forbidden, InvalidRequest, NotFound
from shardline.service.store import ConcurrentUpdate, JobStore
from shardline.workers.contract.events import EventKind
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.progress import EventEntry
from tests.api.conftest import Backend

SPEC: dict[str, Any] = {"name": "faulty", "parallel": {"dp": 2}, "train": {"steps": 7}}


def running(backend: Backend, job_id: str, started_s_ago: float = 0.0) -> None:
    store = JobStore(backend.db)
    store.transition(job_id, JobState.STARTING, "test")
    started = datetime.now(UTC) - timedelta(seconds=started_s_ago)
    store.transition(job_id, JobState.RUNNING, "test", started_at=started)


def test_users_may_not_inject_faults(backend: Backend, user_client: Callable[..., Client]) -> None:
    c = user_client()
    job = c.submit(SPEC)
    running(backend, job["id"])
    with pytest.raises(Forbidden) as err:
        c.inject_fault(job["id"], "kill", 0)
    assert err.value.status == 403 and "administrators" in err.value.message


def test_admins_get_404_409_and_422_for_what_cannot_take_a_fault(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    owner, admin = user_client(), user_client(admin=True)
    with pytest.raises(NotFound):
        admin.inject_fault("nosuchjob", "kill", 0)
    job = owner.submit(SPEC)
    with pytest.raises(Conflict) as queued:
        admin.inject_fault(job["id"], "kill", 0)
    assert "QUEUED" in queued.value.message and "RUNNING" in queued.value.message
    running(backend, job["id"])
    with pytest.raises(InvalidRequest) as out_of_range:
        admin.inject_fault(job["id"], "kill", 2)
    assert out_of_range.value.status == 422
    assert out_of_range.value.details == [
        {"field": "rank", "message": "the job has ranks 0 to 1; pick one of them"}
    ]
    with pytest.raises(InvalidRequest) as bad_kind:
        admin._call("POST", f"/v1/jobs/{job['id']}/faults", json={"kind": "melt", "rank": 0})
    assert bad_kind.value.status == 422 and "kind" in str(bad_kind.value.details)
    # No runtime attached to this server: nothing runs the job, so nothing can take it.
    with pytest.raises(Conflict) as undelivered:
        admin.inject_fault(job["id"], "hang", 1)
    assert "not delivered" in undelivered.value.message


def test_get_job_shows_restarts_steps_and_seconds_lost_and_goodput(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    c = user_client()
    job = c.submit(SPEC)
    fresh = c.get(job["id"])
    assert (fresh["steps_lost"], fresh["seconds_lost"], fresh["goodput"]) == (0, 0.0, None)
    running(backend, job["id"], started_s_ago=100.0)
    store = JobStore(backend.db)
    store.transition(job["id"], JobState.RESTARTING, "boom", restarts=1)
    recovery = EventEntry(
        seq=1,
        message="recovered in 4.0s",
        data={"kind": EventKind.RECOVERY.value, "steps_lost": 3, "seconds_lost": 10.0},
    )
    store.record_progress(job["id"], [recovery], after_seq=0)
    with pytest.raises(ConcurrentUpdate):  # a replay of the same entries counts nothing
        store.record_progress(job["id"], [recovery], after_seq=0)
    store.record_progress(job["id"], [replace(recovery, seq=2)], after_seq=1)
    store.transition(job["id"], JobState.RUNNING, "back")
    store.transition(job["id"], JobState.SUCCEEDED, "done")
    shown = c.get(job["id"])
    assert shown["restarts"] == 1
    assert shown["steps_lost"] == 6 and shown["seconds_lost"] == pytest.approx(20.0)
    # 20 of about 100 seconds lost (a little more wall time passed while this test ran).
    assert shown["goodput"] == pytest.approx(0.8, abs=0.02)
    assert c.get(job["id"])["goodput"] == shown["goodput"]  # fixed once the job ended
