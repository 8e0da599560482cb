"""The profile routes' guards and the merged trace, on SQLite and PostgreSQL (a real
server without Ray: tests/e2e/test_profile.py profiles a running job)."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from shardline.api.client import Client, Conflict, InvalidRequest, NotFound
from shardline.service.profiles import ProfileBusy, Profiles
from shardline.service.store import JobStore
from shardline.workers.contract.lifecycle import JobState
from tests.api.conftest import Backend

SPEC: dict[str, Any] = {"name": "profiled", "parallel": {"dp": 2}, "train": {"steps": 7}}


def test_only_a_running_job_of_ones_own_is_profiled(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    owner, other = user_client(), user_client()
    job = owner.submit(SPEC)["id"]
    with pytest.raises(Conflict, match="only a RUNNING job can be profiled"):
        owner.profile(job, 3)
    with pytest.raises(NotFound):
        other.profile(job, 3)
    with pytest.raises(NotFound):
        owner.profile("nosuchjob", 3)
    for steps in (0, 21, "3"):
        with pytest.raises(InvalidRequest) as bad:
            owner._call("POST", f"/v1/jobs/{job}/profile", json={"steps": steps})
        assert bad.value.details and bad.value.details[0]["field"] == "steps", steps
    with pytest.raises(NotFound, match="no profile"):
        owner.profile_state(job, "0123456789ab")


def rank_trace(rank: int) -> dict[str, Any]:
    """What torch.profiler writes, in brief: its own process name and some spans."""
    return {
        "traceEvents": [
            {"name": "process_name", "ph": "M", "pid": 4000 + rank, "args": {"name": "python"}},
            {"name": "ProfilerStep#0", "ph": "X", "pid": 4000 + rank, "tid": 1, "ts": 0, "dur": 5},
            {"name": "aten::mm", "ph": "X", "pid": 4000 + rank, "tid": 1, "ts": 1, "dur": 2},
        ]
    }


def test_the_ranks_traces_merge_into_one_named_by_rank(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    owner = user_client()
    job = owner.submit(SPEC)["id"]
    store = JobStore(backend.db)
    store.transition(job, JobState.STARTING, "test")
    version = store.transition(job, JobState.RUNNING, "test").version
    profiles = Profiles(backend.server.settings.job_layout(job).profiles_dir)
    profile_id = profiles.begin(1, 2, version)
    with pytest.raises(ProfileBusy, match="still recording"):
        profiles.begin(1, 2, version)  # one at a time
    folder = profiles.folder / profile_id
    (folder / "rank-0.json").write_text(json.dumps(rank_trace(0)))
    state = owner.profile_state(job, profile_id)
    assert state["state"] == "recording" and state["ranks_done"] == [0], state
    with pytest.raises(Conflict, match="is recording"):
        owner.profile_trace(job, profile_id, tmp_path / "t.json")
    (folder / "rank-1.json").write_text(json.dumps(rank_trace(1)))
    state = owner.profile_state(job, profile_id)
    assert state["state"] == "done" and state["trace"].endswith(f"{profile_id}/trace")
    merged = json.loads(owner.profile_trace(job, profile_id, tmp_path / "t.json").read_text())
    names = {
        e["pid"]: e["args"]["name"] for e in merged["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}  # torch's own process names are dropped
    spans = [(e["pid"], e["name"]) for e in merged["traceEvents"] if e["ph"] == "X"]
    assert spans == [(0, "ProfilerStep#0"), (0, "aten::mm"), (1, "ProfilerStep#0"), (1, "aten::mm")]

    # The next profile's job pauses before its ranks write: it failed, and stays failed.
    second = profiles.begin(1, 2, version)
    store.transition(job, JobState.PAUSING, "test")
    state = owner.profile_state(job, second)
    assert state["state"] == "failed" and "stopped or changed" in state["error"], state
    for rank in (0, 1):
        (profiles.folder / second / f"rank-{rank}.json").write_text(json.dumps(rank_trace(rank)))
    assert owner.profile_state(job, second)["state"] == "failed"
    # Not running: a new profile is refused, and says why.
    with pytest.raises(Conflict, match="PAUSING; only a RUNNING job"):
        owner.profile(job, 3)


def test_a_profile_that_cannot_reach_the_ranks_is_refused_and_failed(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    owner = user_client()
    job = owner.submit(SPEC)["id"]
    store = JobStore(backend.db)
    store.transition(job, JobState.STARTING, "test")
    store.transition(job, JobState.RUNNING, "test")
    # This server has no runtime: nothing can take the request.
    with pytest.raises(Conflict, match="the profile was not started"):
        owner.profile(job, 3)
    with pytest.raises(Conflict, match="the profile was not started"):
        owner.profile(job, 3)  # the failed one holds nothing back


def test_first_downloads_at_once_merge_the_trace_once(backend: Backend, tmp_path: Path) -> None:
    """Four first downloads of one profile together: each gets the whole merged trace (they
    used to merge into one temporary file at once, and three were 500s)."""
    _, token = backend.new_user()
    clients = [backend.client(token) for _ in range(4)]
    job = clients[0].submit(SPEC)["id"]
    store = JobStore(backend.db)
    store.transition(job, JobState.STARTING, "test")
    version = store.transition(job, JobState.RUNNING, "test").version
    profiles = Profiles(backend.server.settings.job_layout(job).profiles_dir)
    profile_id = profiles.begin(1, 2, version)
    span = {"name": "aten::mm", "ph": "X", "tid": 1, "ts": 1, "dur": 2}
    for rank in (0, 1):  # large enough that one merge takes a while
        trace = {"traceEvents": [{**span, "pid": rank, "ts": i} for i in range(60_000)]}
        (profiles.folder / profile_id / f"rank-{rank}.json").write_text(json.dumps(trace))
    assert clients[0].profile_state(job, profile_id)["state"] == "done"
    try:
        with ThreadPoolExecutor(len(clients)) as pool:
            paths = list(
                pool.map(
                    lambda i: clients[i].profile_trace(job, profile_id, tmp_path / f"{i}.json"),
                    range(len(clients)),
                )
            )
    finally:
        for c in clients:
            c.close()
    bodies = {p.read_bytes() for p in paths}
    assert len(bodies) == 1
    merged = json.loads(bodies.pop())
    assert sum(e["ph"] == "X" for e in merged["traceEvents"]) == 120_000
    assert not list((profiles.folder / profile_id).glob(".*.partial"))
