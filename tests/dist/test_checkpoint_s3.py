"""A job saves its checkpoints to S3 (a local moto server) and resumes from them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.dist.test_checkpoint import layout_spec, losses, train
from workers.storage.checkpoints import CheckpointStore
from workers.contract.net import free_port
from workers.engine.launch import LocalCheckpoints

BUCKET = "shardline-test"


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    log = (tmp_path / "moto.log").open("w")
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
        # The ranks are spawned processes: they read these from the environment.
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
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
        log.close()


def test_job_saves_to_and_resumes_from_s3(s3_endpoint: str) -> None:
    spec = layout_spec({"dp": 2, "zero_stage": 2})
    folder = f"s3://{BUCKET}/jobs/run-1/checkpoints"
    straight, _ = train(spec, LocalCheckpoints(f"s3://{BUCKET}/jobs/straight"))
    first, _ = train(spec, LocalCheckpoints(folder, stop_after_step=5))
    assert [m["step"] for m in first] == [1, 2, 3, 4, 5]
    store = CheckpointStore(folder)
    assert [c.step for c in store.committed()] == [5, 4]
    names = set(store.find(5).manifest["files"])  # type: ignore[union-attr]
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp"}
    resumed, events = train(spec, LocalCheckpoints(folder, resume=True))
    assert any("restored checkpoint step 5" in e for e in events), events
    want = losses(straight)
    assert [m["step"] for m in resumed] == [6, 7, 8]
    for m in resumed:
        assert m["loss"] == pytest.approx(want[m["step"]], rel=1e-6)
    assert [c.step for c in store.committed()] == [8, 5, 4]
