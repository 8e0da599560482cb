"""A local S3 server (moto) with one bucket, and the AWS_* variables that point this
process, and every process it starts afterwards, at it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from s3fs import S3FileSystem

from shardline.workers.contract.net import free_port

BUCKET = "shardline-test"


@contextmanager
def local_s3(monkeypatch: pytest.MonkeyPatch, log_file: Path) -> Iterator[str]:
    """Start the server, create BUCKET and set the environment; yields its URL."""
    # fsspec keeps one S3FileSystem per set of options, made with the environment of
    # when it was first asked for: one left by an earlier test would reach that test's
    # server, gone by now.
    S3FileSystem.clear_instance_cache()
    port = free_port()
    log = log_file.open("w")
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(url, timeout=1)
                break
            except httpx.TransportError:
                assert server.poll() is None and time.monotonic() < deadline, "moto died"
                time.sleep(0.2)
        # Ranks and Ray nodes started after this read them from the environment.
        for key, value in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": url,
        }.items():
            monkeypatch.setenv(key, value)
        httpx.put(f"{url}/{BUCKET}", timeout=10).raise_for_status()
        yield url
    finally:
        S3FileSystem.clear_instance_cache()
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()
