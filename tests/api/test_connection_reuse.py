"""Busy moments reuse the server's pooled database connections instead of opening (and,
for SQLite, configuring) a new one for most requests."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
from sqlalchemy import event

from shardline.service.db import Database
from tests.api.conftest import Backend

CONCURRENT = 32
REQUESTS = 640


def test_concurrent_reads_reuse_pooled_connections(backend: Backend) -> None:
    _, token = backend.new_user()
    with backend.client(token) as c:
        job_id = c.submit({"name": "polled"})["id"]
    server_db: Database = backend.server.app.state.db
    opened: list[Any] = []

    def count(dbapi_conn: Any, _record: Any) -> None:
        opened.append(dbapi_conn)

    event.listen(server_db.engine, "connect", count)
    try:
        headers = {"Authorization": f"Bearer {token}"}
        # What is asserted is how many connections were opened, not how fast 32 requests at
        # once are answered on 2 cores: after the tiers that start Ray, its idle processes
        # share the machine, and httpx's 5 s default read timeout was seen to run out.
        with httpx.Client(base_url=backend.server.url, headers=headers, timeout=60) as http:

            def read(i: int) -> int:
                path = f"/v1/jobs/{job_id}" if i % 2 else "/v1/jobs?limit=5"
                return http.get(path).status_code

            with ThreadPoolExecutor(CONCURRENT) as pool:
                codes = list(pool.map(read, range(REQUESTS)))
    finally:
        event.remove(server_db.engine, "connect", count)
    assert codes == [200] * REQUESTS
    # At most one new connection per concurrent request: the pool keeps them for the next.
    assert len(opened) <= CONCURRENT, f"{len(opened)} connections opened for {REQUESTS} reads"
