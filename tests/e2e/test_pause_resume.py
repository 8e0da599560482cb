"""Pause and resume through the service: the pause saves a checkpoint and frees the
workers; the resumed job continues from it with every step's loss equal to an
uninterrupted `shardline train` of the same spec."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from tests.e2e.conftest import Service, holds_nothing_within, leftovers, wait_for

ServiceFactory = Callable[..., AbstractContextManager[Service]]
STEPS = 60  # enough to pause mid-run on a loaded machine (CI saw 30 end first) and go on
SHARDLINE = str(Path(sys.executable).parent / "shardline")
# Generous limits: a loaded 2-core machine is slow, and the assertions are about what
# happened, not how fast.
LIMIT_S = 300.0
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")

BODY: dict[str, Any] = {
    "name": "e2e-pause",
    "model": {"preset": "tiny", "seq_len": 32},
    # Two ranks: what a pause saves and restores in each layout is held in tests/dist; here
    # the service's part (the pause, the freed workers, the resume) is what is tested.
    "parallel": {"dp": 2, "zero_stage": 1},
    "train": {
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 3e-3,
        "log_every": 1,
        "seed": 5,
    },
}


def test_paused_job_frees_its_workers_and_resumes_exactly(service: ServiceFactory) -> None:
    reference: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(BODY), 2, on_metrics=reference.append)
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(BODY)
        # `shardline follow` in another terminal, through the pause and the resume.
        env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": svc.token}
        follower = subprocess.Popen(
            [SHARDLINE, "follow", job["id"]], env=env, stdout=PIPE, stderr=PIPE, text=True
        )
        # Paused as soon as it trains: the rest of the run is the margin a loaded machine
        # needs to deliver the pause before the job would end.
        wait_for(c, job["id"], lambda j: j["step"] >= 1, LIMIT_S)
        assert c.pause(job["id"])["state"] in ("PAUSING", "PAUSED")
        paused = wait_for(c, job["id"], lambda j: j["state"] == "PAUSED", LIMIT_S)
        time.sleep(1.5)  # more than the follower's poll: it has seen PAUSED
        assert follower.poll() is None, follower.communicate()
        assert leftovers(svc.ray_address, job["id"]) == {"actors": [], "placement_groups": []}
        checkpoints = c.checkpoints(job["id"])
        assert len(checkpoints) == 1, checkpoints
        at = checkpoints[0]["step"]
        assert 1 <= at < STEPS and paused["latest_checkpoint"] == checkpoints[0]["path"]
        assert checkpoints[0]["bytes"] > 0 and checkpoints[0]["save_s"] > 0
        assert checkpoints[0]["layout"].startswith("pp=1,dp=2,tp=1,zero=1")
        # The rank's log says it stopped as asked: a pause is not the run's end.
        said = c.logs(job["id"], rank=0, tail=1000, contains="rank 0 ")
        assert any(f"rank 0 stopped after step {at}, as asked" in line for line in said), said
        assert not any("finished" in line for line in said), said

        assert c.resume(job["id"])["state"] == "QUEUED"
        done = wait_for(c, job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED"), LIMIT_S)
        assert done["state"] == "SUCCEEDED", done
        metrics = c.metrics(job["id"])
        finished = c.logs(job["id"], rank=0, tail=1000, contains="finished training")
        timeline = c.events(job["id"], after=0)
        events = [e["message"] for e in timeline]
        _, followed = follower.communicate(timeout=60)
        assert follower.returncode == 0, followed

    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), f"step {got['step']}"
    assert len(finished) == 1 and f"finished training: {STEPS} steps, final loss" in finished[0]
    assert any(f"restored checkpoint step {at}" in e for e in events), events
    assert any(e == f"paused after step {at}" for e in events), events
    # One pause and one resume, and a pause is no failure.
    moves = [(e["data"]["from"], e["data"]["to"]) for e in timeline if e["kind"] == "state"]
    assert moves.count(("PAUSING", "PAUSED")) == 1 and moves.count(("PAUSED", "QUEUED")) == 1
    assert [to for _, to in moves].count("PAUSED") == 1, moves
    assert not [e for e in events if e.startswith("failure")], events
    assert (done["failures"], done["restarts"]) == (0, 0)


def test_a_pause_then_a_cancel_ends_cancelled_and_holds_nothing(service: ServiceFactory) -> None:
    # Far more steps than the pause and cancel can take to land, even on a loaded machine
    # (with 30, CI's job once finished first, and a finished job cannot be cancelled).
    body = {**BODY, "train": {**BODY["train"], "steps": 100_000}}
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)
        wait_for(c, job["id"], lambda j: j["step"] >= 3, LIMIT_S)
        c.pause(job["id"])
        time.sleep(0.3)
        c.cancel(job["id"])
        done = wait_for(c, job["id"], lambda j: j["state"] in TERMINAL, LIMIT_S)
        events = [e["message"] for e in c.events(job["id"], after=0)]
        assert done["state"] == "CANCELLED", events
        assert (done["failures"], done["restarts"]) == (0, 0), events
        assert not [e for e in events if e.startswith("failure")], events
        holds_nothing_within(svc.ray_address, job["id"], 60)
