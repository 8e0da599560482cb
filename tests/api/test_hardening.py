"""One bad request, spec or row fails only itself: 4xx for the sender, never a 500 for
anyone, never a stuck scheduler or listing, and never a read of the service's own files."""

from __future__ import annotations

import json
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from sqlalchemy import update

from shardline.service.models import Job
from tests.api.conftest import Backend


def post_spec(
    backend: Backend, token: str, body: bytes, content_type: str = "application/json"
) -> httpx.Response:
    return httpx.post(
        f"{backend.server.url}/v1/jobs",
        content=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": content_type},
    )


def spec_body(**sections: Any) -> bytes:
    # ensure_ascii: a lone surrogate travels as the JSON escape \ud800, as a client sends it.
    return json.dumps({"name": f"job-{uuid.uuid4().hex[:6]}", **sections}).encode()


BAD_VALUES: list[tuple[str, bytes, str]] = [
    ("infinite grad_clip", b'{"name": "x", "train": {"grad_clip": 1e999}}', "train.grad_clip"),
    (
        "lone surrogate tokenizer",
        spec_body(data={"source": "text", "path": "a", "tokenizer": "\ud800"}),
        "data.tokenizer",
    ),
    ("lone surrogate path", spec_body(data={"source": "text", "path": "a\udc00b"}), "data.path"),
    ("NUL in path", spec_body(data={"source": "text", "path": "a\x00b"}), "data.path"),
    ("NUL in preset", spec_body(model={"preset": "tiny\x00"}), "model.preset"),
]


@pytest.mark.parametrize(("label", "body", "field"), BAD_VALUES, ids=[b[0] for b in BAD_VALUES])
def test_unstorable_values_are_a_422_naming_the_field(
    backend: Backend, label: str, body: bytes, field: str
) -> None:
    _, token = backend.new_user()
    response = post_spec(backend, token, body)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["details"][0]["field"] == field
    assert error["message"].startswith(f"{field}: ")
    listing = httpx.get(
        f"{backend.server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}
    )
    assert listing.status_code == 200 and listing.json()["jobs"] == []  # nothing was stored


def test_a_stored_row_that_is_not_json_safe_still_lists_reads_and_cancels(backend: Backend) -> None:
    """Rows stored before the spec refused such values must not break anyone's listing."""
    _, token = backend.new_user()
    _, admin_token = backend.new_user(admin=True)
    created = post_spec(backend, token, spec_body(data={"source": "text", "path": "a.txt"}))
    # data roots do not hold a.txt: submit it as synthetic, then corrupt the stored row.
    if created.status_code != 201:
        created = post_spec(backend, token, spec_body())
    assert created.status_code == 201, created.text
    job_id = created.json()["id"]
    bad_spec = {
        **created.json()["spec"],
        "data": {"source": "text", "path": "x", "tokenizer": "\ud800"},
    }
    bad_spec["train"] = {**bad_spec["train"], "grad_clip": float("inf")}
    try:
        with backend.db.session() as s:
            s.execute(update(Job).where(Job.id == job_id).values(spec=bad_spec))
            s.commit()
    except Exception as err:  # PostgreSQL's json type refuses both; nothing to list there
        pytest.skip(f"{backend.kind} cannot store such a row: {type(err).__name__}")
    for who in (token, admin_token):
        headers = {"Authorization": f"Bearer {who}"}
        listing = httpx.get(f"{backend.server.url}/v1/jobs", headers=headers)
        assert listing.status_code == 200, listing.text
        assert job_id in [j["id"] for j in listing.json()["jobs"]]
    headers = {"Authorization": f"Bearer {token}"}
    one = httpx.get(f"{backend.server.url}/v1/jobs/{job_id}", headers=headers)
    assert one.status_code == 200, one.text
    assert one.json()["spec"]["train"]["grad_clip"] is None
    cancelled = httpx.post(f"{backend.server.url}/v1/jobs/{job_id}/cancel", headers=headers)
    assert cancelled.status_code == 202, cancelled.text
    assert cancelled.json()["state"] == "CANCELLED"


@pytest.mark.parametrize("route", ["events?after=", "metrics?since_step="])
@pytest.mark.parametrize("value", [2**63, 2**64 + 5, 10**30])
def test_huge_query_numbers_are_a_422(backend: Backend, route: str, value: int) -> None:
    _, token = backend.new_user()
    job_id = post_spec(backend, token, spec_body()).json()["id"]
    response = httpx.get(
        f"{backend.server.url}/v1/jobs/{job_id}/{route}{value}",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 422, response.text
    assert response.json()["error"]["details"][0]["field"] in ("query.after", "query.since_step")


def test_deeply_nested_body_is_a_400(backend: Backend) -> None:
    _, token = backend.new_user()
    depth = 30_000  # below the test server's 64 KiB body limit
    response = post_spec(backend, token, b"[" * depth + b"]" * depth)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_json"
    nested_value = b'{"name": "x", "model": ' + b"[" * depth + b"]" * depth + b"}"
    response = post_spec(backend, token, nested_value)
    assert response.status_code == 400, response.text


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", ""])
def test_a_spec_must_be_sent_as_json(backend: Backend, content_type: str) -> None:
    _, token = backend.new_user()
    response = post_spec(backend, token, spec_body(), content_type)
    assert response.status_code == 415, response.text
    assert response.json()["error"]["code"] == "unsupported_media_type"
    ok = post_spec(backend, token, spec_body(), "application/json; charset=utf-8")
    assert ok.status_code == 201, ok.text


def test_cross_field_errors_name_a_field(backend: Backend) -> None:
    _, token = backend.new_user()
    cases = {
        "train.min_lr": spec_body(train={"lr": 0.001, "min_lr": 0.01}),
        "train.global_batch_size": spec_body(train={"global_batch_size": 6, "micro_batch_size": 4}),
        "parallel.sequence_parallel": spec_body(parallel={"sequence_parallel": True}),
        "data.path": spec_body(data={"source": "text"}),
    }
    for field, body in cases.items():
        response = post_spec(backend, token, body)
        assert response.status_code == 422, response.text
        assert response.json()["error"]["details"][0]["field"] == field, response.text


def test_cancelling_twice_succeeds_both_times(backend: Backend) -> None:
    _, token = backend.new_user()
    headers = {"Authorization": f"Bearer {token}"}
    job_id = post_spec(backend, token, spec_body()).json()["id"]
    for _ in range(2):
        response = httpx.post(f"{backend.server.url}/v1/jobs/{job_id}/cancel", headers=headers)
        assert response.status_code == 202, response.text
        assert response.json()["state"] == "CANCELLED"


def test_made_up_methods_do_not_grow_the_metrics(backend: Backend) -> None:
    _, token = backend.new_user(admin=True)  # /metrics is for administrators
    headers = {"Authorization": f"Bearer {token}"}

    def series(client: httpx.Client) -> set[str]:
        text = client.get("/metrics", headers=headers).text
        assert "MADEUP" not in text
        assert "/no/such/route" not in text and "/v1/nothing-" not in text
        return {
            line.rsplit(" ", 1)[0]
            for line in text.splitlines()
            if line.startswith("shardline_http_requests_total")
        }

    with httpx.Client(base_url=backend.server.url) as client:
        for i in range(3):  # every label this test can add, once
            client.request(f"MADEUP{i}", f"/no/such/route/{i}")
            client.request("GET", f"/v1/nothing-{i}")
        before = series(client)
        for i in range(3, 60):
            client.request(f"MADEUP{i}", f"/no/such/route/{i}")
            client.request("GET", f"/v1/nothing-{i}")
        after = series(client)
    # /metrics itself is counted too; nothing else may appear
    assert after - before <= {s for s in after if 'route="/metrics"' in s}, after - before


def test_concurrent_cancels_all_succeed(backend: Backend) -> None:
    _, token = backend.new_user()
    headers = {"Authorization": f"Bearer {token}"}
    url = backend.server.url
    for _ in range(3):
        job_id = post_spec(backend, token, spec_body()).json()["id"]
        with ThreadPoolExecutor(8) as pool:
            responses = list(
                pool.map(
                    lambda _, job=job_id: httpx.post(
                        f"{url}/v1/jobs/{job}/cancel", headers=headers
                    ),
                    range(8),
                )
            )
        assert [r.status_code for r in responses] == [202] * 8, [r.text for r in responses]
        final = httpx.get(f"{url}/v1/jobs/{job_id}", headers=headers).json()
        assert final["state"] == "CANCELLED"


def test_cancelling_a_job_that_ended_otherwise_is_still_a_409(backend: Backend) -> None:
    _, token = backend.new_user()
    job_id = post_spec(backend, token, spec_body()).json()["id"]
    with backend.db.session() as s:
        s.execute(update(Job).where(Job.id == job_id).values(state="SUCCEEDED"))
        s.commit()
    response = httpx.post(
        f"{backend.server.url}/v1/jobs/{job_id}/cancel",
        headers={"Authorization": f"Bearer {token}"},
    )
    assert response.status_code == 409, response.text
    assert response.json()["error"]["code"] == "illegal_transition"


def test_an_8b_model_on_cpu_ranks_is_refused_at_submit(backend: Backend) -> None:
    _, token = backend.new_user()
    response = post_spec(backend, token, spec_body(model={"preset": "8b"}))
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "does_not_fit" and "8.0B parameters" in error["message"]


@pytest.mark.parametrize("name", ["loop/x", "x" * 300, "x" * 300 + "/y"])
def test_paths_that_cannot_be_resolved_are_a_422(backend: Backend, name: str) -> None:
    root = backend.server.settings.data_roots[0]
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "loop").is_symlink():
        (root / "loop").symlink_to(root / "loop")  # a symlink to itself
    _, token = backend.new_user()
    for field, data in (
        ("data.path", {"source": "text", "path": f"{root}/{name}"}),
        ("data.tokenizer", {"source": "synthetic", "tokenizer": f"{root}/{name}"}),
    ):
        response = post_spec(backend, token, spec_body(data=data))
        assert response.status_code == 422, response.text
        assert response.json()["error"]["details"][0]["field"] == field


def test_a_calibration_from_anyone_but_an_admin_is_403_whatever_its_body(
    backend: Backend,
) -> None:
    _, token = backend.new_user()
    for body in ({"ranks": "many"}, {"spec": {"model": {"preset": "nope"}}}, {"x": 1}):
        refused = httpx.post(
            f"{backend.server.url}/v1/cluster/calibrate",
            json=body,
            headers={"Authorization": f"Bearer {token}"},
        )
        assert refused.status_code == 403, refused.text
        assert "for administrators" in refused.text, refused.text
