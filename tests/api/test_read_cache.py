"""The read cache through a real server: polled answers are kept for the configured time,
a write of the server's own process shows at once, and a write of another process within
the bound (SQLite) or at once, as PostgreSQL notifies it (PostgreSQL)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.job_views import JobViews
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from shardline.service.write_notices import APPLICATION_NAME, libpq_url
from tests.support.databases import fresh_postgres
from tests.support.server import run_server

KEEP_S = 5.0


def another_process(db_file: Path, statement: str, *params: object) -> None:
    """`statement` run and committed by a process of its own (as the CLI would)."""
    code = (
        "import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
        f"c.execute({statement!r}, sys.argv[2:]); c.commit()"
    )
    subprocess.run([sys.executable, "-c", code, str(db_file), *map(str, params)], check=True)


def within(seconds: float, probe: Callable[[], bool]) -> float:
    """Seconds until `probe()` holds; fails past `seconds`."""
    start = time.monotonic()
    while not probe():
        assert time.monotonic() - start < seconds, "not seen in time"
        time.sleep(0.05)
    return time.monotonic() - start


def test_kept_answers_own_writes_at_once_and_others_within_the_bound(tmp_path: Path) -> None:
    db_file = tmp_path / "cache.db"
    url = f"sqlite:///{db_file}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    issued = users.issue_token(users.ensure_user("poller"), "test")
    other = users.issue_token(users.ensure_user("someone-else"), "test").token
    settings = Settings(database_url=url, state_dir=tmp_path / "state", read_cache_s=KEEP_S)
    auth = {"Authorization": f"Bearer {issued.token}"}
    try:
        with run_server(settings) as server, httpx.Client(base_url=server.url) as http:
            job = http.post("/v1/jobs", json={"name": "before"}, headers=auth).json()
            path = f"/v1/jobs/{job['id']}"
            assert http.get(path, headers=auth).json()["name"] == "before"
            assert [j["name"] for j in http.get("/v1/jobs", headers=auth).json()["jobs"]] == [
                "before"
            ]
            # Kept for another user too, but given only to those who may see the job. Each
            # 404 reads the database as one for a made-up id does: answered from the cache,
            # it came in half the time, and told the stranger the job exists.
            stranger = {"Authorization": f"Bearer {other}"}
            reads: list[str] = []
            read_for_token = JobViews.get_for_token

            def counted(self: JobViews, job_id: str, token_hash: str) -> Any:
                reads.append(job_id)
                return read_for_token(self, job_id, token_hash)

            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(JobViews, "get_for_token", counted)
                for _ in range(3):
                    assert http.get(path, headers=stranger).status_code == 404
                    assert (
                        http.get("/v1/jobs/0123456789abcdef", headers=stranger).status_code == 404
                    )
                    assert http.get("/v1/jobs", headers=stranger).json()["jobs"] == []
            assert reads == [job["id"], "0123456789abcdef"] * 3

            # Another process renames the job: the kept answers are given until their time
            # is up, then the new name (never later than the bound).
            another_process(db_file, "UPDATE jobs SET name = ? WHERE id = ?", "after", job["id"])
            assert http.get(path, headers=auth).json()["name"] == "before"

            def renamed() -> bool:
                listing = http.get("/v1/jobs", headers=auth).json()["jobs"]
                return http.get(path, headers=auth).json()["name"] == "after" and [
                    j["name"] for j in listing
                ] == ["after"]

            assert within(KEEP_S + 1.0, renamed) > 0.5

            # A write of the server's own process shows at the next read.
            assert http.post(f"{path}/cancel", headers=auth).status_code == 202
            assert http.get(path, headers=auth).json()["state"] == "CANCELLED"
            listing = http.get("/v1/jobs", headers=auth).json()["jobs"]
            assert [j["state"] for j in listing] == ["CANCELLED"]

            # A token revoked by another process stops working within the bound.
            another_process(
                db_file,
                "UPDATE api_tokens SET revoked_at = CURRENT_TIMESTAMP WHERE id = ?",
                issued.token_id,
            )
            within(KEEP_S + 1.0, lambda: http.get(path, headers=auth).status_code == 401)
    finally:
        db.dispose()


def on_another_connection(url: str, statement: str, *params: object) -> None:
    """`statement` committed on a psycopg connection of its own, as a script in psql would:
    no SQLAlchemy, so nothing in this process hears of it but through the database."""
    import psycopg

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(statement, params)


def test_on_postgresql_another_process_s_writes_show_at_once(tmp_path: Path) -> None:
    """Without notices the server would keep answers for KEEP_S; told of each write, it
    shows another connection's within a second, and again after its listening connection
    was cut (it listens again, and meanwhile keeps answers for read_cache_s only)."""
    with fresh_postgres() as url:
        upgrade_to_head(url)
        db = Database(url)
        users = UserDirectory(db)
        poller = users.ensure_user("poller")
        issued = users.issue_token(poller, "test")
        spare = users.issue_token(poller, "another").token
        settings = Settings(
            database_url=url,
            state_dir=tmp_path / "state",
            read_cache_s=KEEP_S,
            read_cache_notified_s=60,
        )
        auth = {"Authorization": f"Bearer {issued.token}"}
        try:
            with run_server(settings) as server, httpx.Client(base_url=server.url) as http:
                cache = server.app.state.read_cache
                within(10, lambda: cache.listening)
                job = http.post("/v1/jobs", json={"name": "first"}, headers=auth).json()
                path = f"/v1/jobs/{job['id']}"

                def named(name: str) -> Callable[[], bool]:
                    def probe() -> bool:
                        listing = http.get("/v1/jobs", headers=auth).json()["jobs"]
                        status = http.get(path, headers=auth).json()
                        return status["name"] == name and [j["name"] for j in listing] == [name]

                    return probe

                assert named("first")()
                rename = "UPDATE jobs SET name = %s WHERE id = %s"
                on_another_connection(url, rename, "second", job["id"])
                within(1.0, named("second"))

                # The listening connection cut: seen again within a reconnect.
                on_another_connection(
                    url,
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE application_name = %s",
                    APPLICATION_NAME,
                )
                on_another_connection(url, rename, "third", job["id"])
                within(3.0, named("third"))
                within(10, lambda: cache.listening)
                on_another_connection(url, rename, "fourth", job["id"])
                within(1.0, named("fourth"))

                # A token revoked by another connection is refused at once; another of the
                # same user still works.
                on_another_connection(
                    url, "UPDATE api_tokens SET revoked_at = now() WHERE id = %s", issued.token_id
                )
                within(1.0, lambda: http.get(path, headers=auth).status_code == 401)
                ok = http.get(path, headers={"Authorization": f"Bearer {spare}"})
                assert ok.status_code == 200
        finally:
            db.dispose()
