"""docker-compose.yml, checked without Docker: it parses, its settings are real, its
commands exist in the installed package, and it keeps what the deployment relies on:
one GPU per GPU worker, a CPU profile that fits the demo, the data folder as a read-only
bind mount, one published port, and secrets that have no default."""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from sqlalchemy.engine import make_url

from shardline.service.config import Settings
from shardline.workers.contract.demand import job_demand
from shardline.workers.contract.spec import load_spec
from tests.deploy.compose_env import (
    MissingVariable,
    active_services,
    interpolate,
    load,
    read_env_file,
)
from tests.deploy.conftest import CHECKOUT, InstalledWheel, outside_env

COMPOSE_FILE = CHECKOUT / "docker-compose.yml"
ENV_EXAMPLE = CHECKOUT / ".env.example"
GPU_WORKERS = tuple(f"ray-worker-gpu{k}" for k in range(8))
RAY_SERVICES = ("ray-head", *GPU_WORKERS, "ray-worker-cpu")
DATA_PATH = "/srv/shardline/data"
SECRETS = ("POSTGRES_PASSWORD", "RAY_AUTH_TOKEN")
# Secrets as a user sets them, with the characters a database URL cannot hold raw.
GOOD_ENV = {"POSTGRES_PASSWORD": "p@ss/w:rd%20#?&=+ 0123456789", "RAY_AUTH_TOKEN": "t" * 48}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    parsed = yaml.safe_load(COMPOSE_FILE.read_text())
    assert isinstance(parsed, dict)
    return parsed


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    """The file as Compose reads it with the secrets set and every other default."""
    return load(COMPOSE_FILE, GOOD_ENV)


def option(command: list[str], name: str) -> str:
    """The value of `--name=VALUE` in a command line."""
    values = [part.split("=", 1)[1] for part in command if part.startswith(f"{name}=")]
    assert len(values) == 1, f"{name} in {command}"
    return values[0]


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {str(k): str(v) for k, v in env.items()}


def test_every_shardline_variable_is_a_setting(compose: dict[str, Any]) -> None:
    # A field read under another name (RAY_AUTH_TOKEN) has no SHARDLINE_ variable.
    known = {
        f"SHARDLINE_{name.upper()}"
        for name, field in Settings.model_fields.items()
        if field.validation_alias is None
    }
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
    # One `--help` per tool and subcommand, with the options of every service using it.
    options: dict[tuple[str, str], set[str]] = {}
    for service in compose["services"].values():
        if "command" in service:
            tool, subcommand, *rest = service["command"]
            options.setdefault((tool, subcommand), set()).update(rest)
    assert set(options) == {("ray", "start"), ("shardline", "serve")}
    for (tool, subcommand), given in options.items():
        helped = subprocess.run(
            [*installed_wheel.tool(tool), subcommand, "--help"],
            env=outside_env(),
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert helped.returncode == 0, f"{tool} {subcommand}: {helped.stderr}"
        for flag in given:
            if flag.startswith("--"):
                assert flag.split("=")[0] in helped.stdout, f"{tool} {subcommand} {flag}"


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
    for name in RAY_SERVICES:
        assert "container_name" not in services[name], name
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
    missing from the image's install: the image copies the package's folder of links and
    every folder a link points to."""
    dockerfile = (CHECKOUT / "Dockerfile").read_text()
    pyproject = tomllib.loads((CHECKOUT / "pyproject.toml").read_text())
    where = pyproject["tool"]["setuptools"]["packages"]["find"]["where"]
    assert where == ["src"]
    assert "COPY src ./src" in dockerfile
    linked = [p for p in (CHECKOUT / "src" / "shardline").iterdir() if p.is_symlink()]
    assert {p.name for p in linked} == {"api", "service", "workers", "migrations"}
    for link in linked:
        target = link.resolve().relative_to(CHECKOUT)
        assert f"COPY {target} ./{target}" in dockerfile, target


def gpu_devices(service: dict[str, Any]) -> list[dict[str, Any]]:
    reservations = service.get("deploy", {}).get("resources", {}).get("reservations", {})
    return [d for d in reservations.get("devices", []) if "gpu" in d.get("capabilities", [])]


def test_each_gpu_worker_reserves_exactly_one_gpu_of_its_own(resolved: dict[str, Any]) -> None:
    """`count: all` (or `count: 1`) gives every container of a service the same GPUs, so
    two workers on one host would both claim them: each worker names its own GPU."""
    services = resolved["services"]
    holders = {name for name, service in services.items() if gpu_devices(service)}
    assert holders == set(GPU_WORKERS)
    taken = []
    for k, name in enumerate(GPU_WORKERS):
        [device] = gpu_devices(services[name])
        assert device["driver"] == "nvidia"
        assert "count" not in device, f"{name}: count reserves the same GPUs in every container"
        assert device["device_ids"] == [str(k)], name
        taken.append(device["device_ids"][0])
        assert option(services[name]["command"], "--num-gpus") == "1", name
        assert float(option(services[name]["command"], "--num-cpus")) >= 1, name
    assert len(set(taken)) == len(taken)


def test_gpus_n_profile_starts_workers_0_to_n_minus_1(resolved: dict[str, Any]) -> None:
    base = {"postgres", "ray-head", "api"}
    assert active_services(resolved, set()) == base
    for n in range(1, len(GPU_WORKERS) + 1):
        started = active_services(resolved, {f"gpus-{n}"})
        assert started == base | set(GPU_WORKERS[:n]), n
    names = {p for s in resolved["services"].values() for p in s.get("profiles", [])}
    assert names == {"cpu", *(f"gpus-{n}" for n in range(1, 9))}
    assert all(re.fullmatch(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+", p) for p in names)


def test_the_cpu_profile_trains_the_demo_with_no_gpu(resolved: dict[str, Any]) -> None:
    services = resolved["services"]
    assert active_services(resolved, {"cpu"}) == {"postgres", "ray-head", "api", "ray-worker-cpu"}
    assert "ray-worker-cpu" not in active_services(resolved, {"gpus-1"})
    worker = services["ray-worker-cpu"]
    assert not gpu_devices(worker) and "deploy" not in worker
    assert option(worker["command"], "--num-gpus") == "0"
    demo = job_demand(load_spec(CHECKOUT / "examples" / "demo.yaml"))
    assert not demo.get("GPU")
    # The default and .env.example's value both fit the demo's ranks.
    assert float(option(worker["command"], "--num-cpus")) >= demo["CPU"]
    example = read_env_file(ENV_EXAMPLE)
    assert float(example["CPU_WORKER_NUM_CPUS"]) >= demo["CPU"]
    assert example["COMPOSE_PROFILES"] in {"cpu", *(f"gpus-{n}" for n in range(1, 9))}


def test_the_heads_cpus_and_each_workers_cpus_come_from_env() -> None:
    env = {**GOOD_ENV, "RAY_HEAD_NUM_CPUS": "3", "CPU_WORKER_NUM_CPUS": "5"}
    env["GPU_WORKER_NUM_CPUS"] = "6"
    services = load(COMPOSE_FILE, env)["services"]
    head = services["ray-head"]["command"]
    assert (option(head, "--num-cpus"), option(head, "--num-gpus")) == ("3", "0")
    assert option(services["ray-worker-cpu"]["command"], "--num-cpus") == "5"
    assert option(services["ray-worker-gpu0"]["command"], "--num-cpus") == "6"
    # By default the head only coordinates.
    default_head = load(COMPOSE_FILE, GOOD_ENV)["services"]["ray-head"]["command"]
    assert option(default_head, "--num-cpus") == "0"


def test_data_is_a_read_only_bind_mount_of_the_folder_env_names(compose: dict[str, Any]) -> None:
    services = compose["services"]
    example = read_env_file(ENV_EXAMPLE)
    for name in ("api", *RAY_SERVICES):
        mounts = [v for v in services[name]["volumes"] if f":{DATA_PATH}" in v]
        assert mounts == [f"${{TRAINING_DATA_DIR:-{example['TRAINING_DATA_DIR']}}}:{DATA_PATH}:ro"]
    assert "data" not in compose["volumes"]  # a named volume nobody can fill
    env = {**GOOD_ENV, "TRAINING_DATA_DIR": "/mnt/corpora"}
    api = load(COMPOSE_FILE, env)["services"]["api"]
    assert f"/mnt/corpora:{DATA_PATH}:ro" in api["volumes"]
    assert environment(api)["SHARDLINE_DATA_ROOTS"] == DATA_PATH


def test_only_the_api_publishes_a_port(compose: dict[str, Any]) -> None:
    published = {name: s["ports"] for name, s in compose["services"].items() if "ports" in s}
    assert published == {"api": ["${API_PUBLISH_PORT:-8000}:8000"]}
    for name, service in compose["services"].items():
        assert service.get("network_mode") is None, name  # host networking publishes all
    api = load(COMPOSE_FILE, {**GOOD_ENV, "API_PUBLISH_PORT": "9000"})["services"]["api"]
    assert api["ports"] == ["9000:8000"]
    assert environment(api)["SHARDLINE_PORT"] == "8000"


def test_secrets_have_no_default_and_env_example_sets_none() -> None:
    text = COMPOSE_FILE.read_text()
    for secret in SECRETS:
        uses = re.findall(rf"\$\{{{secret}([^}}]*)\}}", text)
        assert uses, secret
        assert all(use.startswith(":?") for use in uses), f"{secret}: {uses}"
    example = read_env_file(ENV_EXAMPLE)
    assert all(example[secret] == "" for secret in SECRETS)
    # Compose refuses .env.example as it is.
    with pytest.raises(MissingVariable, match=r"POSTGRES_PASSWORD|RAY_AUTH_TOKEN"):
        load(COMPOSE_FILE, example)


def test_the_api_takes_the_password_apart_and_keeps_every_character(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    api = load(COMPOSE_FILE, GOOD_ENV)["services"]["api"]
    env = environment(api)
    assert make_url(env["SHARDLINE_DATABASE_URL"]).password is None
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    url = make_url(Settings().resolved_database_url)
    assert url.password == GOOD_ENV["POSTGRES_PASSWORD"]
    assert (url.host, url.port, url.database, url.username) == (
        "postgres",
        5432,
        "shardline",
        "shardline",
    )


@pytest.mark.parametrize("secret", SECRETS)
@pytest.mark.parametrize("weak", ["change-me", "CHANGE-ME", "short-0123"])
def test_the_api_refuses_a_placeholder_or_short_secret(
    monkeypatch: pytest.MonkeyPatch, secret: str, weak: str
) -> None:
    api = load(COMPOSE_FILE, {**GOOD_ENV, secret: weak})["services"]["api"]
    for key, value in environment(api).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=r"openssl rand -hex 24") as refused:
        Settings()
    named = "RAY_AUTH_TOKEN" if secret == "RAY_AUTH_TOKEN" else "SHARDLINE_DATABASE_PASSWORD"
    assert named in str(refused.value)
    if weak == "short-0123":
        assert weak not in str(refused.value)  # a real, if short, secret is not echoed


def test_interpolation_reads_like_compose() -> None:
    """The helper the tests above rely on."""
    assert interpolate("${A:-x} ${B-y} ${C:?no} $$", {"A": "", "B": "", "C": "c"}) == "x  c $"
    with pytest.raises(MissingVariable):
        interpolate("${C:?no}", {"C": ""})
