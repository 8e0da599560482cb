"""`docker compose config`: Compose itself validates docker-compose.yml under each profile
(schema, interpolation, merge keys). Needs only Compose, no engine: the docker CLI's
compose plugin, or Debian's `docker-compose` (what .ci/run installs). Skipped, saying so,
where neither is here, and a failure instead where SHARDLINE_TEST_REQUIRE_COMPOSE=1 (CI);
test_compose_file.py checks the file without them."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.conftest import CHECKOUT, outside_env

SECRETS = {"POSTGRES_PASSWORD": "p@ss/w:rd%20-0123456789", "RAY_AUTH_TOKEN": "t" * 48}


def compose_cli() -> list[str]:
    """The Compose command here: `docker compose`, else `docker-compose`."""
    tried = []
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30
        )
        if probe.returncode == 0:
            return [docker, "compose"]
        tried.append((probe.stderr.strip().splitlines() or ["no output"])[0])
    else:
        tried.append("no docker CLI on PATH")
    standalone = shutil.which("docker-compose")
    if standalone is not None:
        return [standalone]
    tried.append("no docker-compose on PATH")
    why = f"Compose is not here ({'; '.join(tried)}): `docker compose config` cannot run"
    if os.environ.get("SHARDLINE_TEST_REQUIRE_COMPOSE") == "1":
        pytest.fail(why)
    pytest.skip(why)


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
    command += ["--profile", profile, "config"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    if cli[-1] == "compose":
        assert set(services) == {"postgres", "ray-head", "api", *workers}
    else:  # docker-compose 1.x lists every service in `config`, whatever the profile
        assert {"postgres", "ray-head", "api", *workers} <= set(services)
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
