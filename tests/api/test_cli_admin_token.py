"""`shardline token create --name NAME` without --admin never hands out an admin token,
even when NAME is an existing admin (the first-start user is called `admin`)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.api.conftest import Backend
from tests.api.test_cli import cli


def test_token_for_an_existing_admin_needs_admin_flag(backend: Backend, tmp_path: Path) -> None:
    admin_name, _ = backend.new_user(admin=True)
    _, user_token = backend.new_user()
    with backend.client(user_token) as c:
        job_id = c.submit({"name": "private"})["id"]
    env = {"SHARDLINE_DATABASE_URL": backend.url}
    plain = cli("token", "create", "--name", admin_name, env=env, cwd=tmp_path)
    assert plain.returncode != 0, plain.stdout
    assert "--admin" in plain.stderr and plain.stdout.strip() == ""
    granted = cli("token", "create", "--name", admin_name, "--admin", env=env, cwd=tmp_path)
    assert granted.returncode == 0, granted.stderr
    response = httpx.get(
        f"{backend.server.url}/v1/jobs/{job_id}",
        headers={"Authorization": f"Bearer {granted.stdout.strip()}"},
    )
    assert response.status_code == 200  # an admin, knowingly
