"""The read cache through a real server (SQLite file): polled answers are kept for the
configured time, a write of the server's own process shows at once, and a write of
another process within the bound."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from service.config import Settings
from service.db import Database
from service.migrate import upgrade_to_head
from service.users import UserDirectory
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
            # Kept for another user too, but given only to those who may see the job.
            stranger = {"Authorization": f"Bearer {other}"}
            assert http.get(path, headers=stranger).status_code == 404
            assert http.get("/v1/jobs", headers=stranger).json()["jobs"] == []

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
