"""PostgreSQL stopped under load: 503 with Retry-After (never a 500, never a hang); once it
is back the same server recovers, and every job it acknowledged (2xx) is there.

A private PostgreSQL server is stopped and started under a real uvicorn server while
client threads submit (each submit retried with its Idempotency-Key until acknowledged)
and list."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import select

from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.models import Job
from shardline.service.users import UserDirectory
from tests.support.databases import REQUIRE_ENV
from tests.support.postgres_server import postgres_bindir
from tests.support.restartable_postgres import PostgresProcess, restartable_postgres
from tests.support.server import run_server

CLIENTS = 8
# A request that takes longer than this while the database is down counts as a hang.
HANG_S = 15.0


@dataclass
class Load:
    """What the client threads saw: statuses, the slowest answer, acknowledged jobs."""

    statuses: Counter[int] = field(default_factory=Counter)
    retry_after: set[str] = field(default_factory=set)
    slowest_s: float = 0.0
    acknowledged: dict[str, str] = field(default_factory=dict)  # Idempotency-Key -> job id
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def record(self, response: httpx.Response, elapsed_s: float) -> None:
        with self.lock:
            self.statuses[response.status_code] += 1
            self.slowest_s = max(self.slowest_s, elapsed_s)
            if response.status_code == 503:
                self.retry_after.add(response.headers.get("Retry-After", ""))
                if response.json()["error"]["code"] != "unavailable":
                    self.unexpected.append(response.text)
            elif response.status_code not in (200, 201):
                self.unexpected.append(f"{response.status_code}: {response.text[:300]}")


def client_loop(url: str, token: str, worker: int, load: Load, stop: threading.Event) -> None:
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
        n = 0
        while not stop.is_set():
            key = f"w{worker}-{n}"
            # Retry one submit until acknowledged, as a careful client does; the key makes
            # a retry of a submit that was stored but not answered return the same job.
            while not stop.is_set():
                started = time.monotonic()
                response = http.post(
                    "/v1/jobs", json={"name": key}, headers={"Idempotency-Key": key}
                )
                load.record(response, time.monotonic() - started)
                if response.status_code in (200, 201):
                    with load.lock:
                        load.acknowledged[key] = response.json()["id"]
                    break
                time.sleep(0.2)
            started = time.monotonic()
            load.record(http.get("/v1/jobs", params={"limit": 5}), time.monotonic() - started)
            n += 1


@pytest.fixture
def postgres() -> Iterator[PostgresProcess]:
    bindir = postgres_bindir()
    if bindir is None:
        reason = "PostgreSQL is not installed (no initdb); apt-get install postgresql"
        if os.environ.get(REQUIRE_ENV) == "1":  # CI: a skipped tier must not pass as green
            pytest.fail(f"{reason}, and {REQUIRE_ENV}=1", pytrace=False)
        pytest.skip(reason)
    with restartable_postgres(bindir) as server:
        yield server


def wait_for(predicate: object, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.2)


def test_postgres_restart_under_load(
    postgres: PostgresProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="shardline")
    upgrade_to_head(postgres.url)
    db = Database(postgres.url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user("loader"), "test").token
    settings = Settings(
        database_url=postgres.url, state_dir=tmp_path / "state", data_roots=[tmp_path / "data"]
    )
    load, stop = Load(), threading.Event()
    with run_server(settings) as server:
        threads = [
            threading.Thread(target=client_loop, args=(server.url, token, i, load, stop))
            for i in range(CLIENTS)
        ]
        for t in threads:
            t.start()
        try:
            wait_for(lambda: len(load.acknowledged) >= 20, 60, "no jobs acknowledged at first")
            postgres.stop()
            before = load.statuses[503]
            wait_for(lambda: load.statuses[503] >= before + 20, 60, "no 503s while it is down")
            time.sleep(2)  # clients keep retrying against the stopped database
            acknowledged_while_down = len(load.acknowledged)
            postgres.start()
            wait_for(
                lambda: len(load.acknowledged) >= acknowledged_while_down + 20,
                60,
                "the API did not recover after PostgreSQL came back",
            )
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        readyz = httpx.get(f"{server.url}/readyz", timeout=30)
    assert readyz.status_code == 200
    assert load.unexpected == [], load.unexpected[:5]
    assert load.statuses[500] == 0
    # The outage is said once, not a line for each of its 503s.
    said = [r.getMessage() for r in caplog.records if r.name == "shardline.api.errors"]
    assert len(said) == 1 and load.statuses[503] >= 20, (len(said), said[:3], load.statuses)
    assert "the database does not answer; requests get 503" in said[0]
    assert load.retry_after == {"5"}
    assert load.slowest_s < HANG_S, f"a request took {load.slowest_s:.1f}s"
    # Every acknowledged job is stored, once per key.
    with db.session() as s:
        stored = dict(s.execute(select(Job.idempotency_key, Job.id)).all())
    db.dispose()
    missing = {k: v for k, v in load.acknowledged.items() if stored.get(k) != v}
    assert missing == {}, f"{len(missing)} acknowledged jobs are not stored: {list(missing)[:5]}"
