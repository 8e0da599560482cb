"""`shardline serve` on its embedded defaults: SQLite under ./.shardline, an admin token."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import httpx

from workers.net import free_port

SHARDLINE = str(Path(sys.executable).parent / "shardline")


def start(cwd: Path, port: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [SHARDLINE, "serve", "--port", str(port)],
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")},
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"serve did not become ready: {proc.stdout.read() if proc.stdout else ''}")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    return out


def test_first_start_creates_an_admin_token_once(tmp_path: Path) -> None:
    port = free_port()
    first = start(tmp_path, port)
    token_file = tmp_path / ".shardline" / "admin-token"
    token = token_file.read_text().strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    assert (tmp_path / ".shardline" / "shardline.db").is_file()
    jobs = subprocess.run(
        [SHARDLINE, "jobs"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={**os.environ, "SHARDLINE_PORT": str(port)},
    )
    assert jobs.returncode == 0, jobs.stderr  # the CLI found the saved token by itself
    out = stop(first)
    assert token in out  # printed once, on first start

    second = start(tmp_path, port)
    headers = {"Authorization": f"Bearer {token}"}
    assert httpx.get(f"http://127.0.0.1:{port}/v1/jobs", headers=headers).status_code == 200
    out = stop(second)
    assert "shl_" not in out and token_file.read_text().strip() == token
