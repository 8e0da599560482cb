"""What the README promises of `shardline submit --follow` and `shardline demo` (which
`make demo` runs), as a user runs them: subprocesses against a real service on real Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import yaml

from service.local_ray import find_local_ray
from tests.e2e.conftest import Service, job_spec

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SHARDLINE = str(Path(sys.executable).parent / "shardline")


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHARDLINE, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=600
    )


def spec_file(folder: Path, body: dict[str, Any]) -> str:
    path = folder / f"{body['name']}.yaml"
    path.write_text(yaml.safe_dump(body))
    return str(path)


def test_submit_follow_returns_when_the_job_ends_with_its_outcome(
    service: ServiceFactory, tmp_path: Path
) -> None:
    good = spec_file(tmp_path, job_spec("followed"))
    # Valid at submit, fails in the worker: the token file does not exist.
    doomed = job_spec("follow-fails")
    doomed["data"] = {"source": "tokens", "path": str(tmp_path / "missing.bin")}
    doomed["fault_tolerance"] = {"max_failures": 0}
    bad = spec_file(tmp_path, doomed)
    with service() as svc, svc.running() as server, svc.client(server) as c:
        env = {**os.environ, "SHARDLINE_URL": server.url, "SHARDLINE_TOKEN": svc.token}
        followed = cli("submit", good, "--follow", env=env, cwd=tmp_path)
        assert followed.returncode == 0, followed.stderr
        job_id = followed.stdout.split()[0]
        # It returned only once the job had trained to the end.
        job = c.get(job_id)
        assert job["state"] == "SUCCEEDED" and job["step"] == 8, job

        failed = cli("submit", bad, "--follow", env=env, cwd=tmp_path)
        assert failed.returncode == 1, failed.stderr
        assert "ended FAILED" in failed.stderr and "missing.bin" in failed.stderr
        assert c.get(failed.stdout.split()[0])["state"] == "FAILED"


def test_demo_runs_a_job_to_success_and_stops_everything(tmp_path: Path) -> None:
    # `make demo` is `shardline demo examples/demo.yaml`; a smaller spec keeps this quick.
    state = tmp_path / "state"
    spec = spec_file(tmp_path, job_spec("demo", steps=6))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")}
    try:
        demo = cli("demo", spec, "--state-dir", str(state), env=env, cwd=tmp_path)
    finally:
        # Whatever happened, leave no Ray head behind; if there was one, that is a failure.
        leftover = find_local_ray(state)
        if leftover is not None:
            leftover.stop()
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "SUCCEEDED after 6 steps" in demo.stdout
    summary = json.loads(next(line for line in demo.stdout.splitlines() if line.startswith("{")))
    assert summary["steps"] == 6 and summary["layout"] == "pp=1,dp=2,tp=1,zero=1,fp32"
    # It stopped the service and the Ray head it started.
    assert "Stopped." in demo.stdout
    assert leftover is None, "demo left its Ray head running"
