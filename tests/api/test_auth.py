"""Every /v1 route needs a live token; users see only their own jobs; admins see all."""

from __future__ import annotations

import httpx
import pytest

from tests.api.conftest import Backend

ROUTES = [
    ("GET", "/v1/jobs"),
    ("POST", "/v1/jobs"),
    ("GET", "/v1/jobs/{id}"),
    ("POST", "/v1/jobs/{id}/cancel"),
    ("GET", "/v1/jobs/{id}/events"),
    ("GET", "/v1/jobs/{id}/metrics"),
    ("GET", "/v1/jobs/{id}/checkpoints"),
    ("GET", "/v1/jobs/{id}/logs"),
    ("GET", "/v1/cluster"),
]


@pytest.fixture
def owned_job(backend: Backend) -> tuple[str, str]:
    _, token = backend.new_user()
    with backend.client(token) as c:
        return token, c.submit({"name": "mine"})["id"]


def _call(
    backend: Backend, method: str, route: str, job_id: str, token: str | None
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    return httpx.request(
        method,
        backend.server.url + route.format(id=job_id),
        headers=headers,
        json={"name": "x"} if method == "POST" else None,
    )


@pytest.mark.parametrize(("method", "route"), ROUTES)
def test_no_token_wrong_token_and_revoked_token_are_401(
    backend: Backend, owned_job: tuple[str, str], method: str, route: str
) -> None:
    _, job_id = owned_job
    _, doomed = backend.new_user()
    token_id = next(t.id for t in backend.users.list_tokens() if doomed.startswith(t.prefix))
    assert backend.users.revoke(token_id)
    for token in (None, "shl_not-a-real-token", doomed):
        response = _call(backend, method, route, job_id, token)
        assert response.status_code == 401, (token, response.text)
        body = response.json()["error"]
        assert body["code"] == "unauthorized" and body["message"]
        assert response.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(("method", "route"), [r for r in ROUTES if "{id}" in r[1]])
def test_another_users_job_is_404(
    backend: Backend, owned_job: tuple[str, str], method: str, route: str
) -> None:
    _, job_id = owned_job
    _, stranger = backend.new_user()
    response = _call(backend, method, route, job_id, stranger)
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"


def test_users_list_only_their_jobs_and_admins_see_all(
    backend: Backend, owned_job: tuple[str, str]
) -> None:
    owner_token, job_id = owned_job
    _, stranger = backend.new_user()
    _, admin = backend.new_user(admin=True)
    with backend.client(stranger) as c:
        assert job_id not in {j["id"] for j in c.list(limit=200)["jobs"]}
    with backend.client(owner_token) as c:
        assert [j["id"] for j in c.list()["jobs"]] == [job_id]
    with backend.client(admin) as c:
        assert c.get(job_id)["id"] == job_id
        assert job_id in {j["id"] for j in c.list(limit=200)["jobs"]}
        assert c.cancel(job_id)["state"] == "CANCELLED"


def test_revoking_a_token_takes_effect_at_once(backend: Backend) -> None:
    _, token = backend.new_user()
    with backend.client(token) as c:
        c.list()
        token_id = next(t.id for t in backend.users.list_tokens() if token.startswith(t.prefix))
        backend.users.revoke(token_id)
        response = httpx.get(
            f"{backend.server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}
        )
        assert response.status_code == 401


def test_tokens_are_stored_hashed(backend: Backend) -> None:
    from sqlalchemy import select

    from shardline.service.models import ApiToken

    _, token = backend.new_user()
    with backend.db.session() as s:
        stored = list(s.scalars(select(ApiToken.token_hash)))
    assert token not in stored and all(len(h) == 64 for h in stored)
