"""Submit, list, get and cancel through the SDK against the real server."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC
from typing import Any

import httpx
import pytest

from shardline.api.client import Client, NotFound
from shardline.service.store import JobStore
from shardline.workers.contract.progress import EventEntry, MetricsEntry, ProgressEntry
from tests.api.conftest import Backend

SPEC: dict[str, Any] = {"name": "api-job", "train": {"steps": 7}}


def test_submitted_job_is_queued_and_readable(user_client: Callable[..., Client]) -> None:
    c = user_client()
    job = c.submit(SPEC)
    assert job["state"] == "QUEUED" and job["steps"] == 7 and job["step"] == 0
    assert job["name"] == "api-job" and job["owner"].startswith("user-")
    assert job["spec"]["train"]["steps"] == 7
    assert job["spec"]["model"]["preset"] == "tiny"  # defaults are filled in and stored
    again = c.get(job["id"])
    assert again["id"] == job["id"] and again["created_at"] == job["created_at"]
    assert again["created_at"].endswith("+00:00")
    events = c.events(job["id"])
    assert [e["kind"] for e in events] == ["submitted"]
    assert c.metrics(job["id"]) == [] and c.checkpoints(job["id"]) == []
    assert c.logs(job["id"]) == []


def test_list_filters_by_state_and_pages_with_a_cursor(user_client: Callable[..., Client]) -> None:
    c = user_client()
    ids = [c.submit({**SPEC, "name": f"page-{i}"})["id"] for i in range(5)]
    c.cancel(ids[0])
    seen: list[str] = []
    cursor = None
    while True:
        page = c.list(limit=2, cursor=cursor)
        assert len(page["jobs"]) <= 2
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))  # newest first, each exactly once
    assert [j["id"] for j in c.list(state="CANCELLED")["jobs"]] == [ids[0]]
    assert {j["id"] for j in c.list(state="QUEUED")["jobs"]} == set(ids[1:])


def test_cancel_a_queued_job_ends_it_with_events(user_client: Callable[..., Client]) -> None:
    c = user_client()
    job = c.submit(SPEC)
    cancelled = c.cancel(job["id"])
    assert cancelled["state"] == "CANCELLED" and cancelled["finished_at"] is not None
    moves = [
        (e["data"]["from"], e["data"]["to"]) for e in c.events(job["id"]) if e["kind"] == "state"
    ]
    assert moves == [("QUEUED", "CANCELLING"), ("CANCELLING", "CANCELLED")]
    # Cancel is idempotent: asking again (or racing another cancel) is answered, not a 409.
    again = c.cancel(job["id"])
    assert again["state"] == "CANCELLED" and again["version"] == cancelled["version"]


def test_unknown_job_is_404_with_the_error_shape(user_client: Callable[..., Client]) -> None:
    with pytest.raises(NotFound) as err:
        user_client().get("does-not-exist")
    assert err.value.code == "not_found" and err.value.status == 404


def test_cluster_says_jobs_stay_queued_without_a_runtime(
    user_client: Callable[..., Client],
) -> None:
    info = user_client().cluster()
    assert info["connected"] is False and "stay QUEUED" in info["message"]


def test_cluster_counts_only_the_callers_jobs_unless_an_admin_asks(
    user_client: Callable[..., Client],
) -> None:
    owner, other, admin = user_client(), user_client(), user_client(admin=True)
    owner.submit(SPEC)
    owner.submit(SPEC)
    assert owner.cluster()["jobs"] == {"QUEUED": 2}
    assert other.cluster()["jobs"] == {}
    assert admin.cluster()["jobs"].get("QUEUED", 0) >= 2


def test_health_readiness_and_prometheus(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    import httpx

    url = backend.server.url
    assert httpx.get(f"{url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{url}/readyz").json() == {"status": "ready"}
    assert httpx.get(f"{url}/metrics").status_code == 401
    c = user_client()
    c.submit(SPEC)
    # It counts every user's jobs: for administrators only.
    _, token = backend.new_user()
    user_get = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"})
    assert user_get.status_code == 403
    _, token = backend.new_user(admin=True)
    text = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {token}"}).text
    assert 'shardline_jobs{state="QUEUED"}' in text
    assert "shardline_http_requests_total" in text
    assert httpx.get(f"{url}/openapi.json").json()["paths"]["/v1/jobs"]["post"]


def test_events_metrics_and_logs_read_from_where_the_caller_left_off(backend: Backend) -> None:
    """`after`, `since_step` and `tail`, as the CLI and web page poll them."""
    _, token = backend.new_user()
    with backend.client(token) as c:
        job_id = c.submit(SPEC)["id"]
        # What the reconciler writes for a job that ran: five logged steps, two events.
        entries: list[ProgressEntry] = [
            MetricsEntry(seq=s, step=s, values={"step": s, "loss": 9.0 - s}) for s in range(1, 6)
        ]
        entries += [
            EventEntry(seq=6, message="workers started"),
            EventEntry(seq=7, message="step 5 reached"),
        ]
        JobStore(backend.db).record_progress(job_id, entries, after_seq=0)
        assert [m["step"] for m in c.metrics(job_id, since_step=3)] == [4, 5]
        assert [m["loss"] for m in c.metrics(job_id, since_step=3)] == [5.0, 4.0]
        events = c.events(job_id)
        assert [e["message"] for e in events][-2:] == ["workers started", "step 5 reached"]
        newer = c.events(job_id, after=events[-2]["id"])
        assert [e["message"] for e in newer] == ["step 5 reached"]
        assert c.events(job_id, after=events[-1]["id"]) == []

        # A rank's log, where the worker writes it.
        log_dir = backend.server.settings.resolved_storage_root / job_id / "logs"
        log_dir.mkdir(parents=True)
        (log_dir / "rank-1.log").write_text("".join(f"line {i}\n" for i in range(10)))
        assert c.logs(job_id, rank=1, tail=3) == ["line 7", "line 8", "line 9"]
        assert c.logs(job_id, rank=1) == [f"line {i}" for i in range(10)]
        assert c.logs(job_id, rank=0) == []


def test_a_step_the_store_has_is_never_written_twice(backend: Backend) -> None:
    """The store keeps the first record of a step: a replay (the same step in a later
    batch, after a rollback or a supervisor that sends again) and a step twice in one
    batch each leave one row, with the values first recorded."""
    _, token = backend.new_user()
    store = JobStore(backend.db)
    with backend.client(token) as c:
        job_id = c.submit(SPEC)["id"]
        first = [MetricsEntry(seq=s, step=s, values={"step": s, "loss": 9.0 - s}) for s in (1, 2)]
        seq = store.record_progress(job_id, first, after_seq=0)
        again = [
            MetricsEntry(seq=seq + 1, step=2, values={"step": 2, "loss": 0.5}),
            MetricsEntry(seq=seq + 2, step=3, values={"step": 3, "loss": 6.0}),
            MetricsEntry(seq=seq + 3, step=3, values={"step": 3, "loss": 0.25}),
        ]
        store.record_progress(job_id, again, after_seq=seq)
        metrics = c.metrics(job_id)
        assert [m["step"] for m in metrics] == [1, 2, 3]
        assert [m["loss"] for m in metrics] == [8.0, 7.0, 6.0]


def _first_step_series(backend: Backend, token: str) -> dict[str, float]:
    text = httpx.get(
        f"{backend.server.url}/metrics", headers={"Authorization": f"Bearer {token}"}
    ).text
    return {
        name.removeprefix("shardline_first_step_seconds"): float(value)
        for name, value in (
            line.rsplit(" ", 1)
            for line in text.splitlines()
            if line.startswith("shardline_first_step_seconds")
        )
    }


def test_submit_to_first_step_is_a_histogram_on_metrics(backend: Backend) -> None:
    _, token = backend.new_user()
    _, admin = backend.new_user(admin=True)
    with backend.client(token) as c:
        job_id = c.submit(SPEC)["id"]
    store = JobStore(backend.db)
    created = store.get(job_id).created_at
    submitted = (created if created.tzinfo else created.replace(tzinfo=UTC)).timestamp()
    before = _first_step_series(backend, admin)
    values = {"step": 1, "loss": 2.0, "time": submitted + 1.5}
    step = MetricsEntry(step=1, values=values, seq=1)
    store.record_progress(job_id, [step], after_seq=0)
    after = _first_step_series(backend, admin)
    grew = {k: after[k] - before.get(k, 0.0) for k in after}
    assert grew['_bucket{le="1.0"}'] == 0 and grew['_bucket{le="2.0"}'] == 1
    assert grew['_bucket{le="+Inf"}'] == 1 and grew["_count"] == 1
    assert grew["_sum"] == pytest.approx(1.5, abs=0.01)
