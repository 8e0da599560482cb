"""`docker compose config`: Compose itself validates docker-compose.yml under each profile
(schema, interpolation, merge keys). Needs only the docker CLI and its compose plugin, no
engine; skipped, saying so, where they are missing (test_compose_file.py checks the file
without them)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.deploy.conftest import CHECKOUT, outside_env

SECRETS = {"POSTGRES_PASSWORD": "p@ss/w:rd%20-0123456789", "RAY_AUTH_TOKEN": "t" * 48}


def compose_cli() -> list[str]:
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("the docker CLI is not on PATH: `docker compose config` cannot run here")
    probe = subprocess.run(
        [docker, "compose", "version"], capture_output=True, text=True, timeout=30
    )
    if probe.returncode != 0:
        why = (probe.stderr.strip().splitlines() or ["no output"])[0]
        pytest.skip(f"the docker CLI has no compose plugin here ({why})")
    return [docker, "compose"]


@pytest.mark.parametrize(
    ("profile", "workers"),
    [("cpu", {"ray-worker-cpu"}), ("gpus-2", {"ray-worker-gpu0", "ray-worker-gpu1"})],
)
def test_compose_accepts_the_file(tmp_path: Path, profile: str, workers: set[str]) -> None:
    cli = compose_cli()
    env_file = tmp_path / "env"
    env_file.write_text("".join(f"{k}='{v}'\n" for k, v in SECRETS.items()))
    # Only our variables: a COMPOSE_* or secret of the caller's shell would win over them.
    env = {k: v for k, v in outside_env().items() if not k.startswith("COMPOSE_")}
    env = {k: v for k, v in env.items() if k not in SECRETS}
    command = [*cli, "-f", str(CHECKOUT / "docker-compose.yml"), "--env-file", str(env_file)]
    command += ["--profile", profile, "config", "--format", "json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    services = json.loads(done.stdout)["services"]
    assert set(services) == {"postgres", "ray-head", "api", *workers}
    api_env = services["api"]["environment"]
    assert api_env["SHARDLINE_DATABASE_PASSWORD"] == SECRETS["POSTGRES_PASSWORD"]


def test_compose_refuses_the_example_env_as_it_is(tmp_path: Path) -> None:
    cli = compose_cli()
    env = {k: v for k, v in outside_env().items() if not k.startswith("COMPOSE_")}
    env = {k: v for k, v in env.items() if k not in SECRETS}
    command = [*cli, "-f", str(CHECKOUT / "docker-compose.yml")]
    command += ["--env-file", str(CHECKOUT / ".env.example"), "config", "--quiet"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    assert "in .env" in done.stderr
