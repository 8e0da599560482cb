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

from shardline.service.local_ray import find_local_ray
from tests.e2e.conftest import Service, job_spec

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SHARDLINE = str(Path(sys.executable).parent / "shardline")
CHECKOUT = Path(__file__).parents[2]


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
    # Valid at submit, fails in the worker: the token file is not a whole number of ids.
    doomed = job_spec("follow-fails")
    (tmp_path / "torn.bin").write_bytes(b"\x01\x02\x03")
    doomed["data"] = {"source": "tokens", "path": str(tmp_path / "torn.bin")}
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
        # Not a terminal: plain progress lines on stdout, not a bar drawn at the end.
        lines = followed.stdout.splitlines()
        assert any(line.startswith(f"{job_id}  step 8/8  SUCCEEDED") for line in lines), lines

        failed = cli("submit", bad, "--follow", env=env, cwd=tmp_path)
        assert failed.returncode == 1, failed.stderr
        assert "ended FAILED" in failed.stderr and "whole number" in failed.stderr
        assert c.get(failed.stdout.split()[0])["state"] == "FAILED"


def demo(
    spec: str, state: Path, cwd: Path, **env: str
) -> tuple[subprocess.CompletedProcess[str], bool]:
    """`shardline demo SPEC` as a user runs it (none of the tests' SHARDLINE_ settings);
    returns its outcome and whether it left a Ray head behind (stopped here if so)."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")}
    try:
        done = cli("demo", spec, "--state-dir", str(state), env={**clean, **env}, cwd=cwd)
    finally:
        # Whatever happened, leave no Ray head behind; if there was one, that is a failure.
        leftover = find_local_ray(state)
        if leftover is not None:
            leftover.stop()
    return done, leftover is not None


def test_demo_runs_the_chat_example_to_success_and_stops_everything(tmp_path: Path) -> None:
    """`shardline demo` (which `make demo` runs) with the README's chat example as written,
    through the service on Ray: conversations in JSON Lines, the loss on the replies only,
    packed; then the service and the Ray head it started are stopped."""
    state = tmp_path / "state"
    done, left_ray = demo(
        "examples/chat-finetune.yaml", state, CHECKOUT, SHARDLINE_CACHE_DIR=str(tmp_path / "cache")
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "SUCCEEDED after 60 steps" in out
    summary = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    assert summary["steps"] == 60 and summary["layout"].startswith("pp=1,dp=")
    # From ln(256) = 5.5: the replies (a sum and the end-of-turn marker) are learned.
    assert summary["final_loss"] < 0.5
    assert list((tmp_path / "cache" / "records").iterdir())  # tokenized once, cached
    # Where the admin token is and how to log in with it, never the token itself.
    token_file = (state / "admin-token").absolute()
    assert f"The admin token is in {token_file}" in out and "shardline login --url" in out
    assert token_file.read_text().strip() not in out
    # It stopped the service and the Ray head it started.
    assert "Stopped." in out
    assert not left_ray, "demo left its Ray head running"


def readme_sdk_snippet() -> str:
    """The README's Python SDK example, exactly as a reader would copy it."""
    text = (CHECKOUT / "README.md").read_text()
    section = text[text.index("### Python SDK") :]
    start = section.index("```python\n") + len("```python\n")
    return section[start : section.index("\n```", start)]


def test_a_new_user_logs_in_once_and_runs_the_readme_example(
    service: ServiceFactory, tmp_path: Path
) -> None:
    # Nothing from the test's environment: only the config home `login` writes to.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    with service() as svc, svc.running() as server, svc.client(server) as c:
        logged = cli("login", "--url", server.url, "--token", svc.token, env=env, cwd=tmp_path)
        assert logged.returncode == 0, logged.stderr

        # A GPU example on this CPU-only cluster is refused at submit, saying so.
        gpu = cli("submit", str(CHECKOUT / "examples" / "bench-1b.yaml"), env=env, cwd=tmp_path)
        assert gpu.returncode == 1 and "this cluster has no GPUs" in gpu.stderr, gpu.stderr

        # The README's SDK example as written, run from the checkout (its spec path is
        # relative to it), finds the server and token through Client.from_env().
        example = subprocess.run(
            [sys.executable, "-c", readme_sdk_snippet()],
            capture_output=True,
            text=True,
            env=env,
            cwd=CHECKOUT,
            timeout=600,
        )
        assert example.returncode == 0, example.stderr
        assert example.stdout.startswith("SUCCEEDED "), example.stdout
        (job,) = c.list()["jobs"]
        assert job["name"] == "demo" and job["step"] == job["steps"] == 40

        waited = cli("wait", job["id"], env=env, cwd=tmp_path)
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout.split()[:2] == [job["id"], "SUCCEEDED"]
