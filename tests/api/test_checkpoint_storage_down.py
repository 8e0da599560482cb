"""Checkpoints on an object store that does not answer: the reads the API makes of it
(a `resume_from` check, an export) say so with a 503, never a 500."""

from __future__ import annotations

from pathlib import Path

import pytest

from shardline.api.client import Client, ShardlineError
from shardline.service.config import Settings
from shardline.workers.contract.net import free_port
from tests.support.databases import fresh_database, migrated_with_token
from tests.support.server import run_server


def test_an_unreachable_checkpoint_store_is_a_503_that_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # An S3 endpoint where nothing listens, tried once (no retries to wait through).
    for key, value in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}",
        "AWS_MAX_ATTEMPTS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    with fresh_database("sqlite", tmp_path) as url:
        token = migrated_with_token(url)
        settings = Settings(
            database_url=url, state_dir=tmp_path / "state", checkpoint_root="s3://gone/ckpts"
        )
        with run_server(settings) as server, Client(server.url, token) as c:
            source = c.submit({"name": "source"})
            for attempt in (
                lambda: c.submit({"name": "r", "resume_from": {"job_id": source["id"]}}),
                lambda: c.export(source["id"], tmp_path / "model.zip"),
            ):
                with pytest.raises(ShardlineError) as caught:
                    attempt()
                assert caught.value.status == 503, caught.value
                assert "the checkpoint storage did not answer" in str(caught.value)
                assert "SHARDLINE_CHECKPOINT_ROOT" in str(caught.value)
