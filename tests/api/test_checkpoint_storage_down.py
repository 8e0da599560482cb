"""Checkpoints on an object store that does not answer: the reads the API makes of it
(a `resume_from` check, an export) say so with a 503, never a 500, within the storage
limits (seconds, not minutes), naming the job's checkpoints and never the store's
endpoint, bucket or prefix."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec.config
import pytest
from s3fs import S3FileSystem

from shardline.api.client import Client, ShardlineError
from shardline.service.config import Settings
from shardline.workers.contract.net import free_port
from shardline.workers.storage import limits
from tests.support.databases import fresh_database, migrated_with_token
from tests.support.server import run_server


@contextmanager
def silent_store() -> Iterator[str]:
    """An endpoint that accepts connections and never answers; yields its URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        listener.close()


# What each store's failure is called (a mistake in the limits themselves would be a
# TypeError, and a 503 all the same).
KINDS = {"refusing": "EndpointConnectionError", "silent": "ReadTimeoutError"}


@pytest.mark.parametrize("store", ["refusing", "silent"])
def test_an_unreachable_checkpoint_store_is_a_503_that_says_so(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    S3FileSystem.clear_instance_cache()  # one made with another endpoint would be reused
    # The server installs its limits in this process: the next tests get theirs back.
    monkeypatch.setitem(fsspec.config.conf, "s3", {})
    monkeypatch.setattr(S3FileSystem, "retries", S3FileSystem.retries)
    monkeypatch.setattr(limits, "_installed", None)
    with contextlib_endpoint(store) as endpoint:
        for key, value in {
            "AWS_ACCESS_KEY_ID": "test",
            "AWS_SECRET_ACCESS_KEY": "test",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
        }.items():
            monkeypatch.setenv(key, value)
        with fresh_database("sqlite", tmp_path) as url:
            token = migrated_with_token(url)
            settings = Settings(
                database_url=url,
                state_dir=tmp_path / "state",
                checkpoint_root="s3://gone-bucket/secret-prefix",
                storage_connect_timeout_s=1,
                storage_read_timeout_s=1,
                storage_attempts=2,
            )
            with run_server(settings) as server, Client(server.url, token) as c:
                source = c.submit({"name": "source"})
                for attempt in (
                    lambda: c.submit({"name": "r", "resume_from": {"job_id": source["id"]}}),
                    lambda: c.export(source["id"], tmp_path / "model.zip"),
                ):
                    began = time.monotonic()
                    with pytest.raises(ShardlineError) as caught:
                        attempt()
                    # Two attempts of a second each: a silent store held it 405-418 s.
                    assert time.monotonic() - began < 20
                    said = str(caught.value)
                    assert caught.value.status == 503, caught.value
                    assert f"did not answer a read of job {source['id']}'s checkpoints" in said
                    assert KINDS[store] in said, said  # the store's failure, not another
                    assert "SHARDLINE_CHECKPOINT_ROOT" in said
                    for secret in (endpoint, "127.0.0.1", "gone-bucket", "secret-prefix"):
                        assert secret not in said, said
    S3FileSystem.clear_instance_cache()


@contextmanager
def contextlib_endpoint(store: str) -> Iterator[str]:
    if store == "silent":
        with silent_store() as url:
            yield url
    else:  # nothing listens there
        yield f"http://127.0.0.1:{free_port()}"
