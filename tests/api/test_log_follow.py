"""GET /v1/jobs/{id}/logs?follow=true on a real server, where no Ray runs the job."""

from __future__ import annotations

import httpx
import pytest

from shardline.api import log_stream
from tests.api.conftest import Backend


def test_a_follow_of_a_job_that_never_starts_says_so_instead_of_staying_silent(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server runs in this process: a shorter keep-alive keeps the test short.
    monkeypatch.setattr(log_stream, "KEEPALIVE_S", 0.6)
    _, token = backend.new_user()
    c = backend.client(token)
    job = c.submit({"name": "never-starts"})  # nothing runs jobs on this server
    with httpx.stream(
        "GET",
        f"{backend.server.url}/v1/jobs/{job['id']}/logs",
        params={"follow": "true"},
        headers={"Authorization": f"Bearer {token}"},
        timeout=httpx.Timeout(5.0),  # silence longer than this fails the test
    ) as response:
        lines = response.iter_lines()
        for _ in range(2):  # and again while nothing else comes
            line = next(lines)
            assert line.startswith("[shardline] the job is QUEUED"), line
            assert "no new log lines" in line
        c.cancel(job["id"])
        assert list(lines)[-1:] in ([], [line])  # the stream ends with the job
