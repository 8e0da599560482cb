"""A private PostgreSQL server that a test can stop and start again (same data, same port),
to see what the service does while its database is gone and after it returns."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from shardline.workers.contract.net import free_port
from tests.support.postgres_server import _wait_ready


class PostgresProcess:
    """One cluster (initdb once) and its server process, started and stopped on demand."""

    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        # Not under pytest's tmp_path: its parents are private to root, closed to `postgres`.
        self.folder = Path(tempfile.mkdtemp(prefix="shardline-pg-"))
        self.as_user: list[str] = []
        if os.geteuid() == 0:
            owner = pwd.getpwnam("postgres")
            os.chown(self.folder, owner.pw_uid, owner.pw_gid)
            self.as_user = ["runuser", "-u", "postgres", "--"]
        self.data, self.port = self.folder / "data", free_port()
        self.server: subprocess.Popen[bytes] | None = None
        initdb = ["-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"]
        initdb += ["--encoding=UTF8", "--locale=C"]
        subprocess.run(
            [*self.as_user, str(bindir / "initdb"), *initdb], check=True, capture_output=True
        )

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        options = {
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.folder),
            "fsync": "off",  # a throwaway cluster
        }
        flags = [f for key, value in options.items() for f in ("-c", f"{key}={value}")]
        command = [str(self.bindir / "postgres"), "-D", str(self.data), "-p", str(self.port)]
        with (self.folder / "server.log").open("ab") as log:
            self.server = subprocess.Popen(
                [*self.as_user, *command, *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _wait_ready(self.bindir, self.port, self.server)

    def stop(self) -> None:
        """PostgreSQL's "fast" shutdown: open sessions are ended, as in a restart."""
        if self.server is not None and self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGINT)
            self.server.wait(timeout=60)
        self.server = None

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


@contextmanager
def restartable_postgres(bindir: Path) -> Iterator[PostgresProcess]:
    server = PostgresProcess(bindir)
    try:
        server.start()
        yield server
    finally:
        server.remove()
