"""The embedded service of the demo and the benchmarks leaves nothing behind, even when it
stops with a job still running (a bench that failed mid-trial once left its Ray head up)."""

from __future__ import annotations

import os
from pathlib import Path

from shardline.api.local_service import local_service
from shardline.service.local_ray import find_local_ray, session_members
from tests.e2e.conftest import job_spec, wait_for


def test_a_local_service_stopped_mid_job_stops_its_ray_head(tmp_path: Path) -> None:
    state = tmp_path / "state"
    try:
        with local_service(state) as svc, svc.client() as client:
            job = client.submit(job_spec("left-running", steps=100_000))
            wait_for(client, job["id"], lambda j: j["state"] == "RUNNING" and j["step"] >= 1, 180)
            head = find_local_ray(state)
            assert head is not None
    finally:
        # Whatever happened, leave no Ray head behind; if there was one, that is a failure.
        leftover = find_local_ray(state)
        if leftover is not None:
            leftover.stop()
    assert leftover is None
    assert session_members(head.pid) == [], "the head's processes outlived the service"
    assert not (head.private_dir and head.private_dir.exists())
    assert os.path.exists(state)  # the state itself is the caller's
