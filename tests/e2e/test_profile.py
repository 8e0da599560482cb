"""A profile on demand of a running dp=2 job on real Ray, as a user takes it with
`shardline profile`: one Chrome trace with both ranks' steps, while training goes on."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from shardline.api.client import Conflict
from tests.e2e.conftest import Service, job_spec, leftovers, wait_for

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SHARDLINE = str(Path(sys.executable).parent / "shardline")


def test_a_profile_of_both_ranks_downloads_while_the_job_trains(
    service: ServiceFactory, tmp_path: Path
) -> None:
    body = job_spec("profiled", steps=100_000)
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        wait_for(c, job["id"], lambda j: j["step"] >= 3, 120)
        env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": svc.token}
        before = c.get(job["id"])["step"]
        out = tmp_path / "trace.json"
        took = subprocess.run(
            [SHARDLINE, "profile", job["id"], "--steps", "3", "-o", str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert took.returncode == 0, took.stderr
        during = c.get(job["id"])["step"]
        assert during >= before + 3  # it trained the profiled steps
        # One at a time: a second profile while one records is refused.
        first = c.profile(job["id"], 20)
        with pytest.raises(Conflict, match="still recording"):
            c.profile(job["id"], 2)
        assert c.wait_for_profile(job["id"], first["id"], timeout=120)["state"] == "done"
        wait_for(c, job["id"], lambda j: j["step"] > during + 20, 120)  # and goes on after
        said = [e["message"] for e in c.events(job["id"])]
        c.cancel(job["id"])
        # Its workers gone before the service stops: the next test on this cluster needs them.
        assert c.wait(job["id"], timeout=120)["state"] == "CANCELLED"
        assert leftovers(svc.ray_address, job["id"]) == {"actors": [], "placement_groups": []}
    assert any(m.startswith("profile ") and "next 3 steps" in m for m in said), said
    trace = json.loads(out.read_text())
    names = {
        e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"
    }
    assert names == {0: "rank 0", 1: "rank 1"}
    for rank in (0, 1):
        events = [e for e in trace["traceEvents"] if e.get("pid") == rank and e["ph"] != "M"]
        steps = {e["name"] for e in events if e["name"].startswith("ProfilerStep#")}
        assert len(steps) == 3, (rank, steps)
        assert any(e["name"].startswith("aten::") for e in events), rank
        # The gradients' all-reduce (or ZeRO's reduce-scatter) of a dp=2 job is in the trace.
        assert any("gloo" in e["name"] or "c10d" in e["name"] for e in events), rank
