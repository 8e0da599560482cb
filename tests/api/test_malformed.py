"""Bad requests get a 4xx with the error shape, never a 500."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.api.conftest import Backend

BAD_BODIES: list[tuple[str, bytes, str]] = [
    ("not json", b"{name: x", "invalid_json"),
    ("not utf-8", b'{"name": "\xff\xfe"}', "invalid_body"),
    ("a list", b'[{"name": "x"}]', "validation_error"),
    ("missing name", b"{}", "validation_error"),
    (
        "wrong type",
        json.dumps({"name": "x", "train": {"steps": "many"}}).encode(),
        "validation_error",
    ),
    (
        "negative size",
        json.dumps({"name": "x", "model": {"dim": -64}}).encode(),
        "validation_error",
    ),
    ("unknown field", json.dumps({"name": "x", "optimizer": "sgd"}).encode(), "validation_error"),
    (
        "inconsistent layout",
        json.dumps({"name": "x", "parallel": {"dp": 3}}).encode(),
        "validation_error",
    ),
    (
        "huge number",
        json.dumps({"name": "x", "train": {"steps": 10**30}}).encode(),
        "validation_error",
    ),
    ("infinite float", b'{"name": "x", "train": {"lr": 1e999}}', "validation_error"),
    (
        "quoted number",
        json.dumps({"name": "x", "train": {"steps": "10"}}).encode(),
        "validation_error",
    ),
    (
        "boolean count",
        json.dumps({"name": "x", "parallel": {"dp": True}}).encode(),
        "validation_error",
    ),
    (
        "number switch",
        json.dumps({"name": "x", "checkpoint": {"async_save": 1}}).encode(),
        "validation_error",
    ),
    ("null section", json.dumps({"name": "x", "model": None}).encode(), "validation_error"),
    ("bad enum", json.dumps({"name": "x", "precision": "fp64"}).encode(), "validation_error"),
    (
        "data outside roots",
        json.dumps({"name": "x", "data": {"source": "text", "path": "/etc"}}).encode(),
        "validation_error",
    ),
]


@pytest.mark.parametrize(("label", "body", "code"), BAD_BODIES, ids=[b[0] for b in BAD_BODIES])
def test_malformed_spec_is_a_4xx_with_the_error_shape(
    backend: Backend, label: str, body: bytes, code: str
) -> None:
    _, token = backend.new_user()
    response = httpx.post(
        f"{backend.server.url}/v1/jobs",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert 400 <= response.status_code < 500, response.text
    error = response.json()["error"]
    assert error["code"] == code and error["message"]
    assert set(error) == {"code", "message", "details"}


def test_validation_errors_name_the_field(backend: Backend) -> None:
    _, token = backend.new_user()
    response = httpx.post(
        f"{backend.server.url}/v1/jobs",
        json={
            "name": "x",
            "model": {"n_layers": 5},
            "parallel": {"pp": 2},
            "train": {"global_batch_size": 4},
        },
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 422
    error = response.json()["error"]
    assert "model.n_layers=5 is not divisible by parallel.pp=2" in error["message"]
    typed = httpx.post(
        f"{backend.server.url}/v1/jobs",
        json={"name": "x", "train": {"lr": "x"}},
        headers={"Authorization": f"Bearer {token}"},
    ).json()["error"]
    assert typed["details"][0]["field"] == "train.lr"


def test_oversized_body_is_413(backend: Backend) -> None:
    _, token = backend.new_user()
    huge = b'{"name": "' + b"x" * (backend.server.settings.max_body_bytes + 1) + b'"}'
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    response = httpx.post(f"{backend.server.url}/v1/jobs", content=huge, headers=headers)
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "payload_too_large"

    def chunks() -> object:
        for _ in range(100):
            yield b"x" * 1024

    streamed = httpx.post(
        f"{backend.server.url}/v1/jobs",
        content=chunks(),  # type: ignore[arg-type]
        headers=headers,
    )
    assert streamed.status_code == 413


@pytest.mark.parametrize("query", ["state=BOGUS", "limit=0", "cursor=nonsense", "limit=x"])
def test_bad_query_parameters_are_422(backend: Backend, query: str) -> None:
    _, token = backend.new_user()
    response = httpx.get(
        f"{backend.server.url}/v1/jobs?{query}", headers={"Authorization": f"Bearer {token}"}
    )
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "validation_error"


@pytest.mark.parametrize("path", ["metrics?since_step=33067616251", "export?step=33067616251"])
def test_a_step_past_any_job_is_422_not_an_overflow(backend: Backend, path: str) -> None:
    """Steps are 32-bit in the database: PostgreSQL failed the comparison with a 500 (the
    stateful schemathesis run found it); the bound is the spec's own, 10,000,000."""
    _, token = backend.new_user()
    headers = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{backend.server.url}/v1/jobs", json={"name": "x"}, headers=headers)
    response = httpx.get(f"{backend.server.url}/v1/jobs/{job.json()['id']}/{path}", headers=headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "validation_error"


def test_unknown_route_and_method_use_the_error_shape(backend: Backend) -> None:
    missing = httpx.get(f"{backend.server.url}/v1/nothing")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = httpx.delete(f"{backend.server.url}/healthz")
    assert wrong.status_code == 405
    assert wrong.json()["error"]["code"] == "method_not_allowed"


@pytest.mark.parametrize(
    ("body", "content_type", "status", "code"),
    [
        (b'{"kind": "kill", "rank": "0"}', "application/json", 422, "validation_error"),
        (b'{"kind": "kill", "rank": true}', "application/json", 422, "validation_error"),
        (b'{"kind": "kill", "rank": 0, "node": 1}', "application/json", 422, "validation_error"),
        (b'{"kind": "kill", "rank": 0}', None, 415, "unsupported_media_type"),
        (b'{"kind": "\xff"}', "application/json", 400, "invalid_body"),
        (b"[1]", "application/json", 422, "validation_error"),
    ],
    ids=["quoted rank", "boolean rank", "unknown field", "no content type", "not utf-8", "list"],
)
def test_a_bad_fault_body_gets_the_status_and_shape_of_any_bad_body(
    backend: Backend, body: bytes, content_type: str | None, status: int, code: str
) -> None:
    _, token = backend.new_user(admin=True)
    headers = {"Authorization": f"Bearer {token}"}
    if content_type is not None:
        headers["Content-Type"] = content_type
    submitted = httpx.post(
        f"{backend.server.url}/v1/jobs",
        json={"name": "target", "parallel": {"dp": 2}},
        headers={"Authorization": f"Bearer {token}"},
    ).json()
    response = httpx.post(
        f"{backend.server.url}/v1/jobs/{submitted['id']}/faults", content=body, headers=headers
    )
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == code, response.text
    if status == 422 and b"rank" in body and b"node" not in body:
        assert response.json()["error"]["details"][0]["field"] == "rank"
