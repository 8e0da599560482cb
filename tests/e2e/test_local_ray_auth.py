"""The embedded Ray head requires its own token: a client without it cannot run anything,
and a stray ~/.ray/auth_token neither opens nor breaks it."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

from service.local_ray import LocalRay

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


def test_token_file_is_private(ray_cluster: LocalRay) -> None:
    mode = stat.S_IMODE(ray_cluster.auth_token.stat().st_mode)
    assert mode == 0o600 and len(ray_cluster.auth_token.read_text()) == 64


def test_a_client_without_the_token_is_refused(ray_cluster: LocalRay, tmp_path: Path) -> None:
    refused = connect(ray_cluster, tmp_path, {})
    assert refused.returncode != 0 and "ran 42" not in refused.stdout
    stray = tmp_path / ".ray" / "auth_token"
    stray.parent.mkdir()
    stray.write_text("not-the-heads-token")
    wrong = connect(ray_cluster, tmp_path, {"RAY_AUTH_MODE": "token"})
    assert wrong.returncode != 0 and "ran 42" not in wrong.stdout


def test_the_control_planes_way_in_works_despite_a_stray_default_token(
    ray_cluster: LocalRay, tmp_path: Path
) -> None:
    stray = tmp_path / ".ray" / "auth_token"
    stray.parent.mkdir()
    stray.write_text("left-behind-by-another-ray-session")
    ok = connect(ray_cluster, tmp_path, ray_cluster.auth_env)
    assert "ran 42" in ok.stdout, ok.stderr[-2000:]
