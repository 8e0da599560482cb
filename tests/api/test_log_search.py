"""Searching a rank's log and downloading it whole, on SQLite and PostgreSQL (a real
server without Ray: the log is written where a rank would write it)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from shardline.api.client import Client, InvalidRequest, NotFound
from shardline.service import job_logs
from tests.api.conftest import Backend

SPEC: dict[str, Any] = {"name": "logged", "parallel": {"dp": 2}, "train": {"steps": 7}}


def write_log(backend: Backend, job_id: str, rank: int, lines: list[str]) -> Path:
    path = backend.server.settings.job_layout(job_id).log_file(rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def test_a_search_returns_the_last_matching_lines_and_the_log_downloads_whole(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    owner, other = user_client(), user_client()
    job = owner.submit(SPEC)["id"]
    lines = [f"step {i} loss {5 - i / 100:.2f}" for i in range(300)]
    lines[7] = "WARNING gloo: connection reset by peer"
    lines[250] = "Warning: slow step"
    path = write_log(backend, job, 1, lines)
    assert owner.logs(job, rank=1, contains="warning") == [lines[7], lines[250]]
    assert owner.logs(job, rank=1, tail=1, contains="WARNING") == [lines[250]]
    assert owner.logs(job, rank=1, contains="no such text") == []
    assert owner.logs(job, rank=0, contains="step") == []  # rank 0 wrote nothing yet
    saved = owner.download_log(job, tmp_path / "rank-1.log", rank=1)
    assert saved.read_bytes() == path.read_bytes()
    with pytest.raises(NotFound, match="written no log yet"):
        owner.download_log(job, tmp_path / "rank-0.log", rank=0)
    with pytest.raises(NotFound):
        other.download_log(job, tmp_path / "theirs.log", rank=1)
    with pytest.raises(InvalidRequest) as bad:
        owner._call("GET", f"/v1/jobs/{job}/logs", params={"contains": "x", "follow": "true"})
    assert bad.value.details == [{"field": "contains", "message": "not with follow=true"}]


def test_a_search_reads_only_the_end_of_a_huge_log(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(job_logs, "SEARCH_LIMIT_BYTES", 100)
    path = tmp_path / "rank-0.log"
    path.write_text("needle at the start\n" + "hay\n" * 100 + "needle at the end\n")
    assert job_logs.search_lines(path, "NEEDLE", 10) == ["needle at the end"]


def test_a_log_that_grows_while_it_downloads_arrives_whole_as_it_was(
    backend: Backend, user_client: Callable[..., Client], tmp_path: Path
) -> None:
    owner = user_client()
    job = owner.submit(SPEC)["id"]
    path = write_log(backend, job, 0, [f"line {i} " + "x" * 200 for i in range(50_000)])
    before = path.stat().st_size
    stop = threading.Event()

    def append() -> None:  # a rank that goes on logging meanwhile
        with path.open("a") as log:
            while not stop.is_set():
                log.write("appended " + "y" * 200 + "\n")
                log.flush()

    writer = threading.Thread(target=append)
    writer.start()
    try:
        saved = owner.download_log(job, tmp_path / "rank-0.log", rank=0).read_bytes()
    finally:
        stop.set()
        writer.join()
    assert len(saved) >= before
    assert path.read_bytes()[: len(saved)] == saved
