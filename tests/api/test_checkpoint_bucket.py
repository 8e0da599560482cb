"""A bucket is the operator's to make: `serve` refuses a checkpoint root in a bucket that
does not exist, and the checkpoint store's own writes (clearing staging before a save, a
pin, the skipped-batch record) fail in one rather than creating it (s3fs makes a missing
bucket for a folder made in it)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from s3fs import S3FileSystem

from shardline.workers.contract.net import free_port
from shardline.workers.storage.checkpoints import CheckpointStore
from shardline.workers.storage.skipped_batches import SkippedBatches
from tests.support.s3 import BUCKET, local_s3

SHARDLINE = str(Path(sys.executable).parent / "shardline")


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    with local_s3(monkeypatch, tmp_path / "moto.log") as url:
        yield url


def buckets() -> set[str]:
    S3FileSystem.clear_instance_cache()
    return {b.rstrip("/") for b in S3FileSystem().ls("")}


def test_a_save_into_a_missing_bucket_creates_none(s3_endpoint: str) -> None:
    assert buckets() == {BUCKET}
    store = CheckpointStore("s3://nobody-made-this/jobs/a/checkpoints")
    store.clear_staging()  # before a save
    with pytest.raises(FileNotFoundError):
        store.pin(3, 60)
    with pytest.raises(FileNotFoundError):
        SkippedBatches("s3://nobody-made-this/jobs/a/checkpoints").add(4, 4)
    assert buckets() == {BUCKET}
    # In a bucket that exists, the same calls write their objects.
    ours = CheckpointStore(f"s3://{BUCKET}/jobs/a/checkpoints")
    ours.clear_staging()
    ours.unpin(ours.pin(3, 60))
    SkippedBatches(f"s3://{BUCKET}/jobs/a/checkpoints").add(4, 4)


def test_serve_refuses_a_checkpoint_root_in_a_missing_bucket(
    s3_endpoint: str, tmp_path: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDLINE_")}
    env["SHARDLINE_CHECKPOINT_ROOT"] = "s3://nobody-made-this/ckpts"
    done = subprocess.run(
        [SHARDLINE, "serve", "--port", str(free_port())],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: the bucket nobody-made-this of SHARDLINE_CHECKPOINT_ROOT does not exist; "
        "create it (Shardline never creates one) or set SHARDLINE_CHECKPOINT_ROOT to another"
    ]
    assert buckets() == {BUCKET}
