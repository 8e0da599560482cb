"""Following a running job's log through the API and the CLI, until the job ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from tests.e2e.conftest import Service

ServiceFactory = Callable[..., AbstractContextManager[Service]]
STEPS = 300


def logged_steps(lines: list[str]) -> list[int]:
    return [int(m.group(1)) for line in lines if (m := re.search(r"step (\d+) loss", line))]


def test_logs_follow_a_running_job_through_api_and_cli(service: ServiceFactory) -> None:
    body = {
        "name": "follow-logs",
        "model": {"preset": "tiny", "seq_len": 32},
        "parallel": {"dp": 2},
        "train": {"steps": STEPS, "global_batch_size": 2, "micro_batch_size": 1, "log_every": 1},
    }
    with service() as svc, svc.running() as server, svc.client(server) as api:
        job = api.submit(body)
        env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": svc.token}
        command = ["logs", job["id"], "--follow", "--rank", "1", "--tail", "0"]
        cli = subprocess.Popen(
            [str(Path(sys.executable).parent / "shardline"), *command],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            lines: list[str] = []
            state_at_first_line = None
            for line in api.follow_logs(job["id"], rank=0, tail=0):
                if state_at_first_line is None:
                    state_at_first_line = api.get(job["id"])["state"]
                lines.append(line)
            out, err = cli.communicate(timeout=120)
        finally:
            if cli.poll() is None:
                cli.kill()
        # The stream ended on its own because the job did, and it was live before that.
        assert api.get(job["id"])["state"] == "SUCCEEDED"
        assert state_at_first_line in ("STARTING", "RUNNING")
        assert logged_steps(lines) == list(range(1, STEPS + 1))
        assert cli.returncode == 0, err
        assert logged_steps(out.splitlines()) == list(range(1, STEPS + 1))
