"""Per-token rate limit, the limit on failed authentications per address, and per-user
quotas, on a real server over SQLite and PostgreSQL."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from shardline.api.live_tokens import RELOAD_EVERY_S
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from tests.support.databases import fresh_database
from tests.support.server import run_server

BURST = 20


@dataclass
class LimitedServer:
    url: str
    users: UserDirectory

    def token(self, user: str) -> dict[str, str]:
        issued = self.users.issue_token(self.users.ensure_user(user), "test")
        return {"Authorization": f"Bearer {issued.token}"}


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def limited(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LimitedServer]:
    folder: Path = tmp_path_factory.mktemp(f"limits-{request.param}")
    with fresh_database(request.param, folder) as url:
        upgrade_to_head(url)
        settings = Settings(
            database_url=url,
            state_dir=folder / "state",
            data_roots=[folder / "data"],
            # A slow refill, so the test is not racing the clock on a loaded machine.
            rate_limit_per_s=0.001,
            rate_limit_burst=BURST,
            user_max_queued_jobs=2,
            user_max_cpus=4,
        )
        db = Database(url)
        with run_server(settings) as server:
            yield LimitedServer(server.url, UserDirectory(db))
        db.dispose()


def test_a_token_over_its_rate_gets_429_with_retry_after(limited: LimitedServer) -> None:
    first, second = limited.token("rate-a"), limited.token("rate-a")
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        assert [http.get("/v1/jobs", headers=first).status_code for _ in range(BURST)] == [
            200
        ] * BURST
        refused = http.get("/v1/jobs", headers=first)
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) >= 1
        error = refused.json()["error"]
        assert error["code"] == "rate_limited"
        assert "SHARDLINE_RATE_LIMIT_PER_S" in error["message"]
        # A token over its limit is refused before its read: no lookup, no query.
        looked_up: list[str] = []
        authenticate = UserDirectory.authenticate_hash

        def counted(self: UserDirectory, token_hash: str) -> object:
            looked_up.append(token_hash)
            return authenticate(self, token_hash)

        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(UserDirectory, "authenticate_hash", counted)
            again = [http.get("/v1/jobs", headers=first).status_code for _ in range(5)]
        assert again == [429] * 5 and looked_up == []
        # The limit is per token: the same user's other token is not held back.
        assert http.get("/v1/jobs", headers=second).status_code == 200


def test_queued_jobs_over_the_users_limit_get_429_naming_it(limited: LimitedServer) -> None:
    def submit(http: httpx.Client, headers: dict[str, str], key: str) -> httpx.Response:
        return http.post(
            "/v1/jobs", json={"name": key}, headers={**headers, "Idempotency-Key": key}
        )

    owner, other = limited.token("quota-a"), limited.token("quota-b")
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        first = submit(http, owner, "q1")
        assert first.status_code == 201
        assert submit(http, owner, "q2").status_code == 201
        refused = submit(http, owner, "q3")
        assert refused.status_code == 429, refused.text
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert "SHARDLINE_USER_MAX_QUEUED_JOBS=2" in refused.json()["error"]["message"]
        assert int(refused.headers["Retry-After"]) >= 1
        # A replay of a job already queued is answered, not refused.
        assert submit(http, owner, "q1").status_code == 200
        # Another user has a limit of their own.
        assert submit(http, other, "q1").status_code == 201
        # Cancelling one makes room.
        job_id = first.json()["id"]
        assert http.post(f"/v1/jobs/{job_id}/cancel", headers=owner).status_code == 202
        assert submit(http, owner, "q3").status_code == 201


def test_a_job_larger_than_the_resource_quota_is_refused_at_submit(limited: LimitedServer) -> None:
    headers = limited.token("quota-big")
    spec = {"name": "big", "parallel": {"dp": 2}, "resources": {"cpus_per_worker": 3}}
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        refused = http.post("/v1/jobs", json=spec, headers=headers)
    assert refused.status_code == 422
    assert refused.json()["error"]["code"] == "does_not_fit"
    assert "SHARDLINE_USER_MAX_CPUS" in refused.json()["error"]["message"]
    # Exactly the quota (2 ranks x 2 CPU = 4) fits.
    exact = {"name": "exact", "parallel": {"dp": 2}, "resources": {"cpus_per_worker": 2}}
    with httpx.Client(base_url=limited.url, timeout=30) as http:
        assert http.post("/v1/jobs", json=exact, headers=headers).status_code == 201


def test_a_limited_token_is_served_again_once_its_bucket_refills(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'refill.db'}"
    upgrade_to_head(url)
    settings = Settings(
        database_url=url,
        state_dir=tmp_path / "state",
        # One request every 2 s after a burst of 3: the burst is sent well inside that.
        rate_limit_per_s=0.5,
        rate_limit_burst=3,
    )
    db = Database(url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user("refill"), "test").token
    headers = {"Authorization": f"Bearer {token}"}
    with run_server(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        assert [http.get("/v1/jobs", headers=headers).status_code for _ in range(3)] == [200] * 3
        refused = http.get("/v1/jobs", headers=headers)
        assert refused.status_code == 429
        wait_s = int(refused.headers["Retry-After"])
        assert 1 <= wait_s <= 2
        time.sleep(wait_s + 0.1)  # as a client that obeys Retry-After
        assert http.get("/v1/jobs", headers=headers).status_code == 200
    db.dispose()


def test_bad_tokens_from_one_address_get_429_before_any_lookup(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'failures.db'}"
    upgrade_to_head(url)
    settings = Settings(
        database_url=url,
        state_dir=tmp_path / "state",
        auth_failures_per_s=0.001,  # no refill while the test runs
        auth_failures_burst=5,
    )
    db = Database(url)
    users = UserDirectory(db)
    good = {"Authorization": f"Bearer {users.issue_token(users.ensure_user('ok'), 't').token}"}
    bad = {"Authorization": "Bearer not-a-token"}
    looked_up: list[str] = []
    authenticate = UserDirectory.authenticate_hash

    def counted(self: UserDirectory, token_hash: str) -> object:
        looked_up.append(token_hash)
        return authenticate(self, token_hash)

    with (
        pytest.MonkeyPatch.context() as patch,
        run_server(settings) as server,
        httpx.Client(base_url=server.url, timeout=30) as http,
    ):
        patch.setattr(UserDirectory, "authenticate_hash", counted)
        # A good token is no failure and spends nothing.
        assert http.get("/v1/jobs", headers=good).status_code == 200
        statuses = [http.get("/v1/jobs", headers=bad).status_code for _ in range(4)]
        statuses.append(http.get("/v1/jobs").status_code)  # no token at all counts too
        assert statuses == [401] * 5
        lookups = len(looked_up)
        refused = [http.get("/v1/jobs", headers=bad) for _ in range(20)]
        assert {r.status_code for r in refused} == {429}
        assert len(looked_up) == lookups, "a refused request still read the database"
        assert "SHARDLINE_AUTH_FAILURES_PER_S" in refused[0].json()["error"]["message"]
        assert int(refused[0].headers["Retry-After"]) >= 1
        # A header naming another address does not escape the limit: no proxy is trusted.
        spoofed = http.get("/v1/jobs", headers={**bad, "X-Forwarded-For": "10.9.8.7"})
        assert spoofed.status_code == 429
        assert "10.9.8.7" not in spoofed.json()["error"]["message"]
        # The address is held back for every request but one with a live token: another
        # client of the same address is not refused for these bad tokens.
        assert http.get("/v1/jobs", headers=good).status_code == 200
        # Answered before routing (api/auth_guard.py): even a path with no route is a 429,
        # in the one error shape.
        unrouted = http.get("/v1/no/such/route", headers=bad)
        assert unrouted.status_code == 429
        assert unrouted.json()["error"] == refused[0].json()["error"]
        assert set(unrouted.json()["error"]) == {"code", "message", "details"}
        # Health checks need no token and are never held back.
        assert http.get("/healthz").status_code == 200
    db.dispose()


def test_429_and_503_are_documented_with_retry_after(limited: LimitedServer) -> None:
    document = httpx.get(f"{limited.url}/openapi.json", timeout=30).json()
    for path, method in (("/v1/jobs", "post"), ("/v1/jobs", "get"), ("/v1/jobs/{job_id}", "get")):
        responses = document["paths"][path][method]["responses"]
        for status in ("429", "503"):
            assert "Retry-After" in responses[status]["headers"], (path, method, status)
            assert responses[status]["content"]["application/json"]["schema"] == {
                "$ref": "#/components/schemas/ErrorBody"
            }


def test_a_flood_of_bad_tokens_from_a_shared_address_refuses_no_live_token(
    tmp_path: Path,
) -> None:
    """Bad tokens from 127.0.0.1 for a while, as any local client of a default bind may
    send: every request of a user of the same address goes through, a token issued during
    the flood included (a second later), and the live tokens are read at most about once a
    second."""
    url = f"sqlite:///{tmp_path / 'flood.db'}"
    upgrade_to_head(url)
    settings = Settings(
        database_url=url, state_dir=tmp_path / "state", auth_failures_per_s=1, auth_failures_burst=5
    )
    db = Database(url)
    users = UserDirectory(db)
    alice = users.ensure_user("alice")
    good = {"Authorization": f"Bearer {users.issue_token(alice, 'a').token}"}
    flooding = threading.Event()
    flood: list[int] = []

    def send_bad_tokens(base_url: str) -> None:
        with httpx.Client(base_url=base_url, timeout=30) as http:
            while flooding.is_set():
                forged = {"X-Forwarded-For": f"10.0.0.{len(flood) % 250}"}
                bad = {"Authorization": f"Bearer made-up-{len(flood)}", **forged}
                flood.append(http.get("/v1/jobs", headers=bad).status_code)

    with run_server(settings) as server, httpx.Client(base_url=server.url, timeout=30) as http:
        flooding.set()
        flooder = threading.Thread(target=send_bad_tokens, args=(server.url,))
        began = time.monotonic()
        flooder.start()
        try:
            while len(flood) < 10:
                time.sleep(0.01)
            mine = [http.get("/v1/jobs", headers=good).status_code for _ in range(30)]
            # A token issued in another process during the flood: through within a second.
            late = {"Authorization": f"Bearer {users.issue_token(alice, 'b').token}"}
            time.sleep(RELOAD_EVERY_S)
            mine += [http.get("/v1/jobs", headers=late).status_code for _ in range(10)]
        finally:
            flooding.clear()
            flooder.join(timeout=30)
        elapsed = time.monotonic() - began
        reads = server.app.state.live_tokens.reads
    db.dispose()
    assert mine == [200] * 40
    # The flood itself is held back: only its burst and the bucket's refill were looked up.
    looked_up = settings.auth_failures_burst + settings.auth_failures_per_s * elapsed + 1
    assert len(flood) - flood.count(429) <= looked_up, flood
    assert flood.count(429) >= 20, flood
    assert reads <= elapsed / RELOAD_EVERY_S + 2, (reads, elapsed)
