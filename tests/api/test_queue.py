"""PATCH /v1/jobs/{id} (priority) and the queue in GET /v1/cluster, on SQLite and
PostgreSQL (a real server without Ray: jobs stay QUEUED, so the queue holds still)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from shardline.api.client import Client, Conflict, Forbidden, InvalidRequest, NotFound

SPEC: dict[str, Any] = {"name": "queued", "train": {"steps": 5}}


def queue_ids(c: Client) -> list[str]:
    return [q["id"] for q in c.cluster()["queue"]]


def test_an_admin_moves_a_job_up_the_queue_and_its_owner_sees_it(
    user_client: Callable[..., Client],
) -> None:
    owner, admin = user_client(), user_client(admin=True)
    old, young = owner.submit(SPEC)["id"], owner.submit(SPEC)["id"]
    assert queue_ids(owner) == [old, young]
    moved = admin.set_priority(young, 7)
    assert moved["priority"] == 7 and moved["state"] == "QUEUED"
    assert queue_ids(owner) == [young, old]
    mine = owner.cluster()["queue"]
    # Positions count every user's queued jobs (other tests' jobs share this server).
    assert mine[0]["position"] < mine[1]["position"]
    assert mine[0]["priority"] == 7 and mine[0]["reason"] is None
    # The admin sees the same two in the same order, among everyone's.
    everyone = [i for i in queue_ids(admin) if i in (old, young)]
    assert everyone == [young, old]
    said = [e["message"] for e in owner.events(young)]
    assert any(m.startswith("priority 0 -> 7, set by ") for m in said), said


def test_an_owner_may_lower_a_priority_but_not_raise_it(
    user_client: Callable[..., Client],
) -> None:
    owner, other = user_client(), user_client()
    job = owner.submit(SPEC)["id"]
    assert owner.set_priority(job, -5)["priority"] == -5
    with pytest.raises(Forbidden) as raised:
        owner.set_priority(job, 0)
    assert "only an administrator can raise" in raised.value.message
    with pytest.raises(NotFound):  # another user's job is not theirs to see
        other.set_priority(job, -10)
    assert queue_ids(other) == []


def test_a_bad_priority_change_is_refused_with_the_field_named(
    user_client: Callable[..., Client],
) -> None:
    owner, admin = user_client(), user_client(admin=True)
    job = owner.submit(SPEC)["id"]
    for body in ({"priority": "5"}, {"priority": 1001}, {"priority": 1, "name": "x"}, {}):
        with pytest.raises(InvalidRequest) as bad:
            admin._call("PATCH", f"/v1/jobs/{job}", json=body)
        assert bad.value.status == 422, body
        assert bad.value.details and bad.value.details[0]["field"] in ("priority", "name"), body
    not_json = admin._http.patch(
        f"/v1/jobs/{job}", content=b"priority=5", headers={"Content-Type": "text/plain"}
    )
    assert not_json.status_code == 415
    with pytest.raises(NotFound):
        admin.set_priority("nosuchjob", 1)
    owner.cancel(job)
    with pytest.raises(Conflict) as ended:
        admin.set_priority(job, 1)
    assert "has not ended" in ended.value.message


def test_no_runtime_means_no_nodes(user_client: Callable[..., Client]) -> None:
    info = user_client().cluster()
    assert info["runtime"] == "none" and info["nodes"] == []


def test_only_an_admin_submits_a_job_above_priority_0(user_client: Callable[..., Client]) -> None:
    user, admin = user_client(), user_client(admin=True)
    with pytest.raises(Forbidden) as refused:
        user.submit({**SPEC, "priority": 5})
    assert refused.value.details == [
        {"field": "priority", "message": refused.value.details[0]["message"]}
    ]
    assert "above 0 is for administrators" in refused.value.message
    assert user.submit({**SPEC, "priority": -5})["priority"] == -5
    assert admin.submit({**SPEC, "priority": 5})["priority"] == 5
