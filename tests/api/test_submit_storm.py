"""200 submits at once, each key sent twice: exactly 200 jobs, one per key."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.api.conftest import Backend

JOBS = 200


def test_concurrent_submits_with_distinct_keys_make_exactly_one_job_each(
    backend: Backend,
) -> None:
    _, token = backend.new_user()
    headers = {"Authorization": f"Bearer {token}"}
    keys = [f"storm-{i}" for i in range(JOBS)]

    def submit(key: str) -> httpx.Response:
        return httpx.post(
            f"{backend.server.url}/v1/jobs",
            json={"name": f"storm-{key}"},
            headers={**headers, "Idempotency-Key": key},
            timeout=60,
        )

    with ThreadPoolExecutor(32) as pool:
        responses = list(pool.map(submit, keys + keys))
    assert {r.status_code for r in responses} <= {200, 201}, [
        r.text for r in responses if r.status_code not in (200, 201)
    ]
    assert sum(r.status_code == 201 for r in responses) == JOBS
    by_key: dict[str, set[str]] = {}
    for key, response in zip(keys + keys, responses, strict=True):
        by_key.setdefault(key, set()).add(response.json()["id"])
    assert all(len(ids) == 1 for ids in by_key.values())

    listed: list[str] = []
    cursor = None
    with httpx.Client(base_url=backend.server.url, headers=headers) as client:
        while True:
            params = {"limit": 200, **({"cursor": cursor} if cursor else {})}
            page = client.get("/v1/jobs", params=params).json()
            listed += [j["id"] for j in page["jobs"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
    assert len(listed) == len(set(listed)) == JOBS
    assert set(listed) == {i for ids in by_key.values() for i in ids}
