"""POST /v1/plan over HTTP: layouts for a spec, and its mistakes as 4xx."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from shardline.api.client import Client, ShardlineError
from shardline.workers.contract.spec import JobSpec
from tests.api.conftest import Backend

SPEC: dict[str, Any] = {
    "name": "plan",
    "model": {"preset": "tiny", "seq_len": 64},
    "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 2},
}


def test_layouts_on_given_ranks_drop_into_the_spec(
    user_client: Callable[..., Client],
) -> None:
    answer = user_client().plan(SPEC, ranks=4, limit=5)
    assert answer["ranks"] == 4 and answer["device"] == "cpu"
    assert answer["legal"] > 5 and len(answer["layouts"]) == 5
    steps = [item["predicted"]["step_s"] for item in answer["layouts"]]
    assert steps == sorted(steps)
    for item in answer["layouts"]:
        spec = JobSpec.model_validate(
            {**SPEC, "parallel": item["parallel"], "train": {**SPEC["train"], **item["train"]}}
        )
        assert spec.parallel.world_size == 4


def test_64_ranks_of_the_1b_preset_answer_within_a_second(
    user_client: Callable[..., Client],
) -> None:
    client = user_client()
    spec = {"name": "big", "model": {"preset": "1b"}, "train": {"global_batch_size": 256}}
    client.plan(spec, ranks=8)  # the first call imports the planner
    start = time.monotonic()
    answer = client.plan(spec, ranks=64, gpus_per_node=8)
    elapsed = time.monotonic() - start
    assert answer["legal"] > 1000 and answer["layouts"][0]["fits"]
    assert elapsed < 2.0  # the bar is 1 s; a loaded 2-core CI host gets slack


def test_mistakes_are_4xx_with_reasons(backend: Backend) -> None:
    _, token = backend.new_user()
    client = backend.client(token)
    headers = {"Authorization": f"Bearer {token}"}
    with pytest.raises(ShardlineError) as no_room:  # this server has no cluster: nothing is free
        client.plan(SPEC)
    assert no_room.value.status == 422 and "no free resources" in str(no_room.value)
    with pytest.raises(ShardlineError) as seven:
        client.plan(SPEC, ranks=7)
    assert seven.value.status == 422 and "no legal layout" in str(seven.value)
    with pytest.raises(ShardlineError) as bad:
        client.plan({**SPEC, "parallel": {"tp": 3}}, ranks=4)
    assert bad.value.status == 422 and "parallel.tp=3" in str(bad.value)
    with pytest.raises(ShardlineError) as auto:  # parallel: auto needs something free
        client.submit({**SPEC, "parallel": "auto"})
    assert auto.value.status == 422 and "parallel: auto found no free resources" in str(auto.value)
    for body, field in (
        ({"spec": SPEC, "ranks": "4"}, "ranks"),  # a count is a JSON number
        ({"spec": SPEC, "ranks": 2, "bogus": 1}, "bogus"),
        ({"spec": {**SPEC, "model": {"init_from": "/nonexistent"}}, "ranks": 2}, "init_from"),
    ):
        refused = httpx.post(f"{backend.server.url}/v1/plan", json=body, headers=headers)
        assert refused.status_code == 422 and field in refused.text, refused.text
    anonymous = httpx.post(f"{backend.server.url}/v1/plan", json={"spec": SPEC, "ranks": 2})
    assert anonymous.status_code == 401
    client.close()


# A spec whose shape divides every way: 192,732 legal layouts on 2520 ranks, a minute of
# CPU and a gigabyte of memory to predict them all.
CRAFTED: dict[str, Any] = {
    "name": "crafted",
    "model": {
        "preset": "8b",
        "seq_len": 64,
        "dim": 5040,
        "n_heads": 840,
        "n_kv_heads": 840,
        "head_dim": 6,
        "n_layers": 1008,
        "vocab_size": 504000,
    },
    "train": {"global_batch_size": 645120, "micro_batch_size": 1},
}


def test_a_plan_is_bounded_and_one_at_a_time_per_user(backend: Backend) -> None:
    name, token = backend.new_user()
    user = backend.users.find_user(name)
    assert user is not None
    headers = {"Authorization": f"Bearer {token}"}
    url = f"{backend.server.url}/v1/plan"
    turns = backend.server.app.state.plan_turns
    crafted: list[httpx.Response] = []

    def plan_crafted() -> None:
        crafted.append(
            httpx.post(url, json={"spec": CRAFTED, "ranks": 2520}, headers=headers, timeout=120)
        )

    began = time.monotonic()
    planning = threading.Thread(target=plan_crafted)
    planning.start()
    # While it is computed, the same user's next plan is told to wait its turn; another
    # user's plan is answered.
    while not turns.planning(user.id):
        assert planning.is_alive(), [r.text for r in crafted]
        time.sleep(0.01)
    second = httpx.post(url, json={"spec": SPEC, "ranks": 4}, headers=headers, timeout=60)
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "too_many_plans"
    assert "one plan at a time per user" in second.json()["error"]["message"]
    assert int(second.headers["Retry-After"]) >= 1
    _, other = backend.new_user()
    answered = httpx.post(
        url,
        json={"spec": SPEC, "ranks": 4},
        headers={"Authorization": f"Bearer {other}"},
        timeout=60,
    )
    assert answered.status_code == 200
    planning.join(timeout=120)
    elapsed = time.monotonic() - began
    (refused,) = crafted
    assert refused.status_code == 422 and refused.json()["error"]["code"] == "plan_too_large"
    message = refused.json()["error"]["message"]
    assert "parallel.max_tp" in message and ("20000" in message or "5 s of CPU" in message)
    assert elapsed < 30, elapsed  # it took 66 s unbounded
    # Bounded by the spec's own max_tp and max_pp, the same shape plans.
    bounded = {**CRAFTED, "parallel": {"auto": True, "max_tp": 2, "max_pp": 2}}
    answer = httpx.post(url, json={"spec": bounded, "ranks": 2520}, headers=headers, timeout=60)
    assert answer.status_code == 200, answer.text
    assert all(
        item["parallel"]["tp"] <= 2 and item["parallel"]["pp"] <= 2
        for item in answer.json()["layouts"]
    )
