"""`resume_from` at submit: only a job the user may see, only a committed checkpoint."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from shardline.api.client import Client, Conflict, InvalidRequest, NotFound
from tests.api.conftest import Backend


def commit_checkpoint(backend: Backend, job_id: str, step: int) -> None:
    """A committed checkpoint of `job_id` (one small file and its manifest)."""
    store = backend.server.settings.job_layout(job_id).checkpoints()
    staging = Path(store.staging_path(step))
    staging.mkdir(parents=True)
    (staging / "__0_0.distcp").write_bytes(b"shard")
    store.commit(step, store.checksums(str(staging), ["__0_0.distcp"]), {"layout": "x"})


def test_resume_from_another_users_job_is_not_found(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    alice, bob = user_client(), user_client()
    source = alice.submit({"name": "source"})
    commit_checkpoint(backend, source["id"], 4)
    with pytest.raises(NotFound):
        bob.submit({"name": "theft", "resume_from": {"job_id": source["id"]}})
    with pytest.raises(NotFound):
        bob.submit({"name": "theft", "resume_from": {"job_id": "doesnotexist"}})
    mine = alice.submit({"name": "mine", "resume_from": {"job_id": source["id"]}})
    assert mine["spec"]["resume_from"] == {"job_id": source["id"], "step": None}
    admin = user_client(admin=True)
    assert admin.submit({"name": "admin", "resume_from": {"job_id": source["id"], "step": 4}})


def test_resume_from_needs_a_committed_checkpoint(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    c = user_client()
    source = c.submit({"name": "source"})
    with pytest.raises(InvalidRequest, match="has no committed checkpoint yet") as err:
        c.submit({"name": "early", "resume_from": {"job_id": source["id"]}})
    assert err.value.details[0]["field"] == "resume_from.job_id"
    commit_checkpoint(backend, source["id"], 4)
    with pytest.raises(InvalidRequest, match="no committed checkpoint at step 5") as err:
        c.submit({"name": "wrong-step", "resume_from": {"job_id": source["id"], "step": 5}})
    assert err.value.details[0]["field"] == "resume_from.step"
    assert c.submit({"name": "ok", "resume_from": {"job_id": source["id"], "step": 4}})


def test_pause_and_resume_only_where_the_state_allows(user_client: Callable[..., Client]) -> None:
    c = user_client()
    job = c.submit({"name": "queued"})
    with pytest.raises(Conflict, match="only a RUNNING job can be paused"):
        c.pause(job["id"])
    # A queued job is already going to run: a resume changes nothing and says so.
    assert c.resume(job["id"]) == c.get(job["id"])
    c.cancel(job["id"])
    with pytest.raises(Conflict, match="only a PAUSED job can be resumed"):
        c.resume(job["id"])
    with pytest.raises(NotFound):
        user_client().pause(job["id"])
