"""Compose's variable interpolation and profiles, enough to read docker-compose.yml as
Compose would for a given .env, without Docker."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?error}, ${NAME?error}; $$ is a `$`.
_VARIABLE = re.compile(r"\$\$|\$\{(\w+)(?:(:?[-?])([^}]*))?\}")


class MissingVariable(ValueError):
    """A `${NAME:?error}` whose variable is unset or empty: Compose refuses the file."""


def interpolate(text: str, env: dict[str, str]) -> str:
    def value(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, op, arg = match.group(1), match.group(2), match.group(3)
        given = env.get(name)
        unset = given is None or (given == "" and op is not None and op.startswith(":"))
        if op is None:
            return given or ""
        if op.endswith("?"):
            if unset:
                raise MissingVariable(f"{name}: {arg}")
            return str(given)
        return arg if unset else str(given)

    return _VARIABLE.sub(value, text)


def interpolate_all(node: Any, env: dict[str, str]) -> Any:
    if isinstance(node, dict):
        return {key: interpolate_all(value, env) for key, value in node.items()}
    if isinstance(node, list):
        return [interpolate_all(value, env) for value in node]
    if isinstance(node, str):
        return interpolate(node, env)
    return node


def load(path: Path, env: dict[str, str]) -> dict[str, Any]:
    """The file as Compose sees it under `env` (merge keys resolved, variables set)."""
    parsed = interpolate_all(yaml.safe_load(path.read_text()), env)
    assert isinstance(parsed, dict)
    return parsed


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines of a .env file (no quoting needed by ours)."""
    pairs = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            key, _, value = line.partition("=")
            pairs[key.strip()] = value.strip()
    return pairs


def active_services(compose: dict[str, Any], profiles: set[str]) -> set[str]:
    """What `docker compose up` starts with these profiles: every service without
    profiles, and those with one of them."""
    return {
        name
        for name, service in compose["services"].items()
        if not service.get("profiles") or profiles & set(service["profiles"])
    }
