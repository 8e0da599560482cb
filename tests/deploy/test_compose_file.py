"""docker-compose.yml, checked without Docker: it parses, its settings are real, its
commands exist in the installed package, and it keeps what the deployment relies on."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from service.config import Settings
from tests.deploy.conftest import CHECKOUT, InstalledWheel, outside_env

RAY_SERVICES = ("ray-head", "ray-worker")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    parsed = yaml.safe_load((CHECKOUT / "docker-compose.yml").read_text())
    assert isinstance(parsed, dict)
    return parsed


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_every_shardline_variable_is_a_setting(compose: dict[str, Any]) -> None:
    known = {f"SHARDLINE_{name.upper()}" for name in Settings.model_fields}
    used = {
        key
        for service in compose["services"].values()
        for key in environment(service)
        if key.startswith("SHARDLINE_")
    }
    assert used, "the API's settings come from SHARDLINE_* variables"
    assert used <= known, f"not settings: {sorted(used - known)}"
    # Interpolated variables named like settings would be mistaken for them.
    text = (CHECKOUT / "docker-compose.yml").read_text()
    assert set(re.findall(r"\$\{(SHARDLINE_\w+)", text)) <= known


def test_every_command_exists_in_the_installed_package(
    compose: dict[str, Any], installed_wheel: InstalledWheel
) -> None:
    commands = [s["command"] for s in compose["services"].values() if "command" in s]
    assert len(commands) == 3
    for command in commands:
        tool, subcommand = command[0], command[1]
        helped = subprocess.run(
            [*installed_wheel.tool(tool), subcommand, "--help"],
            env=outside_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert helped.returncode == 0, f"{tool} {subcommand}: {helped.stderr}"
        for option in command[2:]:
            if option.startswith("--"):
                assert option.split("=")[0] in helped.stdout, f"{tool} {subcommand} {option}"


def test_services_are_wired_as_the_deployment_needs(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) == {"postgres", "api", *RAY_SERVICES}
    assert "healthcheck" in services["postgres"]
    assert any(v.endswith(":/var/lib/postgresql/data") for v in services["postgres"]["volumes"])
    api = services["api"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    # Ray Client: the API's container runs no raylet, which a host:port driver needs.
    assert environment(api)["SHARDLINE_RAY_ADDRESS"] == "ray://ray-head:10001"
    assert "--ray-client-server-port=10001" in services["ray-head"]["command"]
    assert "ports" not in services["ray-head"]  # dashboard and GCS stay on the network
    assert "--include-dashboard=false" in services["ray-head"]["command"]
    devices = services["ray-worker"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in devices)
    assert "container_name" not in services["ray-worker"]  # `--scale ray-worker=N` works
    for name in ("api", *RAY_SERVICES):
        assert environment(services[name])["RAY_AUTH_MODE"] == "token"


def test_storage_is_one_volume_at_the_same_path_everywhere(compose: dict[str, Any]) -> None:
    services = compose["services"]
    root = environment(services["api"])["SHARDLINE_STORAGE_ROOT"]
    for name in ("api", *RAY_SERVICES):
        assert f"storage:{root}" in services[name]["volumes"], name
    assert "storage" in compose["volumes"]


def test_the_image_installs_the_package_not_an_editable_checkout() -> None:
    dockerfile = (CHECKOUT / "Dockerfile").read_text()
    assert re.search(r"pip install -c constraints\.txt '\.\[postgres\]'", dockerfile)
    assert "-e " not in dockerfile
    assert Path(CHECKOUT / "constraints.txt").is_file()


def test_the_image_copies_every_package_the_wheel_holds() -> None:
    """A package the wheel would carry but the image never copies (migrations/ once) is
    missing from the image's install."""
    dockerfile = (CHECKOUT / "Dockerfile").read_text()
    pyproject = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    include = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    for package in (pattern.rstrip("*") for pattern in include):
        assert f"COPY {package} ./{package}" in dockerfile, package
