"""The polled reads (a job's status, a page of the listing) keep answering while every
database slot of the server process is taken: on SQLite they run on the event loop, on
PostgreSQL they are awaited on asyncio connections, and neither waits behind the gate
that writes waiting for SQLite's lock, or a slow PostgreSQL statement, may fill."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from shardline.service.db import Database
from tests.api.conftest import Backend


@contextmanager
def every_slot_taken(db: Database) -> Iterator[None]:
    slots = db.gate._slots  # the gate's own semaphore: taken as its threads would take it
    for _ in range(db.gate.limit):
        assert slots.acquire(timeout=5)
    try:
        yield
    finally:
        for _ in range(db.gate.limit):
            slots.release()


def test_status_and_listing_answer_while_every_database_slot_is_taken(backend: Backend) -> None:
    _, token = backend.new_user()
    with backend.client(token) as c:
        job_id = c.submit({"name": "polled"})["id"]
    db: Database = backend.server.app.state.db
    headers = {"Authorization": f"Bearer {token}"}
    with every_slot_taken(db), httpx.Client(base_url=backend.server.url, headers=headers) as http:
        started = time.monotonic()
        status = http.get(f"/v1/jobs/{job_id}", timeout=5)
        listing = http.get("/v1/jobs", params={"limit": 5}, timeout=5)
        took = time.monotonic() - started
    assert status.status_code == 200 and status.json()["id"] == job_id, status.text
    assert listing.status_code == 200, listing.text
    assert [j["id"] for j in listing.json()["jobs"]] == [job_id]
    # A gated read would wait for a slot until the pool's 10 s timeout (then a 503).
    assert took < 3, took
