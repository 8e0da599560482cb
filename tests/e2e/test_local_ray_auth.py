"""The embedded Ray head requires its own token: a client without it cannot run anything,
and a stray ~/.ray/auth_token neither opens nor breaks it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from shardline.service.local_ray import LocalRay, _auth_token

PROBE = (
    "import ray; ray.init(address={address!r}, log_to_driver=False); "
    "print('ran', ray.get(ray.remote(lambda: 6 * 7).remote()))"
)


def connect(head: LocalRay, home: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-c", PROBE.format(address=head.address)],
        env={**clean, "HOME": str(home), **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_state_dir_gets_a_private_token_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    token = _auth_token(tmp_path / "state")
    assert token == (tmp_path / "state" / "ray" / "auth_token").resolve()
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and len(token.read_text()) == 64
    assert _auth_token(tmp_path / "state").read_text() == token.read_text()  # kept
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(tmp_path / "operators-token"))
    assert _auth_token(tmp_path / "state") == (tmp_path / "operators-token").resolve()


# A refused driver retries its first GCS call once a second, 20 times by default; 2 tries
# show the refusal as well (the head is up: nothing else could fail in between).
FEW_TRIES = {"RAY_gcs_server_port_wait_time_s": "2"}


def test_a_client_without_the_token_is_refused(ray_cluster: LocalRay, tmp_path: Path) -> None:
    # Refused by Ray's authentication, not by any other crash on the way.
    refused = connect(ray_cluster, tmp_path, FEW_TRIES)
    assert refused.returncode != 0 and "ran 42" not in refused.stdout
    assert "ray.exceptions.AuthenticationError" in refused.stderr, refused.stderr[-2000:]
    stray = tmp_path / ".ray" / "auth_token"
    stray.parent.mkdir()
    stray.write_text("not-the-heads-token")
    wrong = connect(ray_cluster, tmp_path, {"RAY_AUTH_MODE": "token", **FEW_TRIES})
    assert wrong.returncode != 0 and "ran 42" not in wrong.stdout
    assert "ray.exceptions.AuthenticationError" in wrong.stderr, wrong.stderr[-2000:]


def test_the_control_planes_way_in_works_despite_a_stray_default_token(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    stray = tmp_path / ".ray" / "auth_token"
    stray.parent.mkdir()
    stray.write_text("left-behind-by-another-ray-session")
    ok = connect(ray_cluster, tmp_path, ray_cluster.auth_env)
    assert "ran 42" in ok.stdout, ok.stderr[-2000:]
