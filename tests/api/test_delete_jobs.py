"""Deleting an ended job: its record, events, metrics, logs and checkpoints go, a record
of who deleted which job when stays; refused while the job has not ended or another job
still starts from it; another user's job is not found."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import select

from shardline.api.client import Client, Conflict, NotFound
from shardline.service.models import DeletedJob
from tests.api.conftest import Backend
from tests.api.test_resume_from import commit_checkpoint

SHARDLINE = str(Path(sys.executable).parent / "shardline")


def ended_job(backend: Backend, client: Client, name: str = "old") -> str:
    """A CANCELLED job with a log and a committed checkpoint."""
    job = client.submit({"name": name})
    commit_checkpoint(backend, job["id"], 4)
    layout = backend.server.settings.job_layout(job["id"])
    layout.logs_dir.mkdir(parents=True, exist_ok=True)
    layout.log_file(0).write_text("a rank's log\n")
    assert client.cancel(job["id"])["state"] == "CANCELLED"
    return str(job["id"])


def test_an_ended_job_is_deleted_whole_and_the_deletion_kept(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    client = user_client()
    job_id = ended_job(backend, client)
    layout = backend.server.settings.job_layout(job_id)
    assert layout.dir.is_dir() and layout.checkpoints().committed()
    assert client.get(job_id)["state"] == "CANCELLED"  # read (and kept) just before
    gone = client.delete(job_id)
    assert (gone["id"], gone["state"], gone["files_removed"]) == (job_id, "CANCELLED", True)
    assert not layout.dir.exists()
    with pytest.raises(NotFound):
        client.get(job_id)
    with pytest.raises(NotFound):
        client.events(job_id)
    assert job_id not in [j["id"] for j in client.list()["jobs"]]
    with backend.db.session() as s:
        kept = s.scalars(select(DeletedJob).where(DeletedJob.id == job_id)).one()
    assert (kept.name, kept.state) == ("old", "CANCELLED")
    with pytest.raises(NotFound):  # once
        client.delete(job_id)


def test_a_job_that_has_not_ended_is_not_deleted(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    client = user_client()
    queued = client.submit({"name": "waiting"})
    with pytest.raises(Conflict, match="only an ended job can be deleted"):
        client.delete(queued["id"])
    assert client.get(queued["id"])["state"] == "QUEUED"


def test_a_job_another_starts_from_is_kept_until_that_one_ends(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    client = user_client()
    source = ended_job(backend, client, "source")
    follower = client.submit({"name": "next", "resume_from": {"job_id": source}})
    with pytest.raises(Conflict, match=f"job {follower['id']} starts from"):
        client.delete(source)
    client.cancel(follower["id"])
    assert client.delete(source)["id"] == source


def test_another_users_job_is_not_found(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    alice, bob = user_client(), user_client()
    job_id = ended_job(backend, alice)
    with pytest.raises(NotFound):
        bob.delete(job_id)
    assert alice.get(job_id)["state"] == "CANCELLED"
    assert user_client(admin=True).delete(job_id)["id"] == job_id


def test_the_cli_asks_first_unless_told_not_to(
    backend: Backend, user_client: Callable[..., Client]
) -> None:
    _, token = backend.new_user()
    client = backend.client(token)
    job_id = ended_job(backend, client)
    env = {**os.environ, "SHARDLINE_URL": backend.server.url, "SHARDLINE_TOKEN": token}

    def cli(*args: str, answer: str = "") -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [SHARDLINE, *args], input=answer, capture_output=True, text=True, env=env, timeout=120
        )

    kept = cli("delete", job_id, answer="n\n")
    assert kept.returncode == 1 and client.get(job_id)["state"] == "CANCELLED"
    done = cli("delete", job_id, "--yes")
    assert done.returncode == 0 and done.stdout.split() == [job_id, "deleted"], done.stderr
    client.close()
