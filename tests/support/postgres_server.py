"""A private PostgreSQL server as its own process, on a free port, for one test.

Like the `postgres` service of docker-compose: a fresh cluster (initdb), a server process,
a client that waits for it to accept connections. PostgreSQL refuses to run as root, so
as root it runs as the `postgres` user in a folder that user owns.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardline.workers.contract.net import free_port


def postgres_bindir() -> Path | None:
    """The folder of initdb and postgres, or None when PostgreSQL is not installed."""
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    if shutil.which("pg_config"):
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True)
        candidates.insert(0, Path(out.stdout.strip()))
    return next((d for d in candidates if (d / "initdb").is_file()), None)


@contextmanager
def postgres_server(bindir: Path) -> Iterator[str]:
    """Start a throwaway server; yields its SQLAlchemy URL; stops it and deletes its data."""
    # Not under pytest's tmp_path: its parents are private to root, closed to `postgres`.
    folder = Path(tempfile.mkdtemp(prefix="shardline-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:
        owner = pwd.getpwnam("postgres")
        os.chown(folder, owner.pw_uid, owner.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]
    data, port = folder / "data", free_port()
    try:
        initdb = ["-D", str(data), "-U", "postgres", "--auth=trust", "--no-sync"]
        initdb += ["--encoding=UTF8", "--locale=C"]
        subprocess.run([*as_user, str(bindir / "initdb"), *initdb], check=True, capture_output=True)
        options = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(folder),
            "fsync": "off",  # a throwaway cluster
        }
        flags = [f for key, value in options.items() for f in ("-c", f"{key}={value}")]
        with (folder / "server.log").open("ab") as log:
            server = subprocess.Popen(
                [*as_user, str(bindir / "postgres"), "-D", str(data), "-p", str(port), *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            _wait_ready(bindir, port, server)
            yield f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        finally:
            os.killpg(server.pid, signal.SIGINT)  # PostgreSQL's "fast" shutdown
            server.wait(timeout=60)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _wait_ready(bindir: Path, port: int, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    ready = [str(bindir / "pg_isready"), "-h", "127.0.0.1", "-p", str(port), "-q"]
    while subprocess.run(ready).returncode != 0:
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"PostgreSQL did not start (exit {server.poll()})")
        time.sleep(0.3)
