"""The CLI against the real server: jobs, and tokens managed in the real database."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.api.conftest import Backend

SHARDLINE = str(Path(sys.executable).parent / "shardline")


def cli(
    *args: str, env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SHARDLINE, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "COLUMNS": "200", **env},
        cwd=cwd,
    )


def test_submit_list_status_cancel(backend: Backend, tmp_path: Path) -> None:
    _, token = backend.new_user()
    env = {"SHARDLINE_URL": backend.server.url, "SHARDLINE_TOKEN": token}
    spec = tmp_path / "job.yaml"
    spec.write_text("name: from-cli\ntrain: {steps: 4}\n")
    submitted = cli("submit", str(spec), env=env)
    assert submitted.returncode == 0, submitted.stderr
    job_id, name, state = submitted.stdout.split()
    assert (name, state) == ("from-cli", "QUEUED")

    listed = cli("jobs", env=env)
    assert job_id in listed.stdout and "from-cli" in listed.stdout
    narrow = cli("jobs", env={**env, "COLUMNS": "40"})  # whole ids however narrow
    assert job_id in narrow.stdout, narrow.stdout
    assert cli("jobs", "-q", env=env).stdout.split() == [job_id]
    (row,) = [json.loads(line) for line in cli("jobs", "--json", env=env).stdout.splitlines()]
    assert (row["id"], row["name"], row["state"]) == (job_id, "from-cli", "QUEUED")
    status = cli("status", job_id, env=env)
    assert "state: QUEUED" in status.stdout and "step: 0/4" in status.stdout
    lowered = cli("priority", job_id, "-2", env=env)  # a negative value, not an option
    assert lowered.stdout.split() == [job_id, "QUEUED", "priority", "-2"], lowered.stderr
    raised = cli("priority", job_id, "3", env=env)
    assert raised.returncode == 1 and "only an administrator can raise" in raised.stderr
    cancelled = cli("cancel", job_id, env=env)
    assert cancelled.stdout.split() == [job_id, "CANCELLED"]
    assert "state: CANCELLED" in cli("status", job_id, env=env).stdout


def test_errors_are_one_line_not_tracebacks(backend: Backend, tmp_path: Path) -> None:
    _, token = backend.new_user()
    env = {"SHARDLINE_URL": backend.server.url, "SHARDLINE_TOKEN": token}
    missing = cli("status", "no-such-job", env=env)
    assert missing.returncode == 1 and "not_found: no job no-such-job" in missing.stderr
    bad = cli("jobs", env={**env, "SHARDLINE_TOKEN": "wrong"})
    assert bad.returncode == 1 and "unauthorized" in bad.stderr
    down = cli("jobs", env={**env, "SHARDLINE_URL": "http://127.0.0.1:9"})
    assert down.returncode == 1
    assert "cannot reach the Shardline server at http://127.0.0.1:9" in down.stderr
    spec = tmp_path / "bad.yaml"
    spec.write_text("name: x\nparallel: {dp: 3}\n")
    invalid = cli("submit", str(spec), env=env)
    assert (
        invalid.returncode == 2 and "train.global_batch_size=8 is not divisible" in invalid.stderr
    )
    for result in (missing, bad, down, invalid):
        assert "Traceback" not in result.stderr


def test_token_create_list_revoke(backend: Backend, tmp_path: Path) -> None:
    env = {"SHARDLINE_DATABASE_URL": backend.url}
    created = cli("token", "create", "--name", "carol", env=env, cwd=tmp_path)
    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert f"shardline login --url http://127.0.0.1:8000 --token {token}" in created.stderr
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"{backend.server.url}/v1/jobs", headers=headers).status_code == 200
    listing = cli("token", "list", env=env, cwd=tmp_path).stdout
    row = next(line for line in listing.splitlines() if token[:12] in line)
    token_id = row.split("│")[1].strip()
    assert token not in listing  # only the prefix is ever shown again
    assert cli("token", "revoke", token_id, env=env, cwd=tmp_path).returncode == 0
    # Revoked by another process: the server may give its kept answers for up to
    # read_cache_s (1 s; service/read_cache.py), then refuses the token.
    deadline = time.monotonic() + 2.0
    while httpx.get(f"{backend.server.url}/v1/jobs", headers=headers).status_code != 401:
        assert time.monotonic() < deadline, "a token revoked by the CLI is still served"
        time.sleep(0.05)
    again = cli("token", "revoke", token_id, env=env, cwd=tmp_path)
    assert again.returncode == 1 and "no live token" in again.stderr


def test_token_create_admin_sees_everything(backend: Backend, tmp_path: Path) -> None:
    _, user_token = backend.new_user()
    with backend.client(user_token) as c:
        job_id = c.submit({"name": "private"})["id"]
    env = {"SHARDLINE_DATABASE_URL": backend.url}
    admin = cli("token", "create", "--name", "root-ops", "--admin", env=env, cwd=tmp_path)
    assert admin.returncode == 0, admin.stderr
    with backend.client(admin.stdout.strip()) as c:
        assert c.get(job_id)["owner"] != "root-ops"


def test_token_create_refuses_where_there_is_no_server_database(tmp_path: Path) -> None:
    env = {k: "" for k in os.environ if k.startswith("SHARDLINE_")}
    made = cli("token", "create", "--name", "dave", env=env, cwd=tmp_path)
    assert made.returncode == 1 and made.stdout == ""
    assert "no server database here" in made.stderr and "SHARDLINE_DATABASE_URL" in made.stderr
    assert not (tmp_path / ".shardline").exists()  # nothing made that no server uses
