"""A job saves its checkpoints to S3 (a local moto server) and resumes from them."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from pathlib import Path

import pytest

from tests.dist.test_checkpoint import layout_spec, losses, train
from tests.support.s3 import BUCKET, local_s3
from shardline.workers.engine.launch import LocalCheckpoints
from shardline.workers.storage.checkpoints import CheckpointStore


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    with local_s3(monkeypatch, tmp_path / "moto.log") as url:
        yield url


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


class Crash(Exception):
    """The process died here."""


class CrashingFs:
    """The store's filesystem, dying at its `at`-th write (a move, a file opened to
    write, a removal): what a killed rank leaves on the object store."""

    def __init__(self, fs: Any, at: int) -> None:
        self.fs, self.at, self.writes = fs, at, 0

    def _write(self) -> None:
        self.writes += 1
        if self.writes == self.at:
            raise Crash(f"write {self.at}")

    def mv(self, *args: Any, **kwargs: Any) -> Any:
        self._write()
        return self.fs.mv(*args, **kwargs)

    def rm(self, *args: Any, **kwargs: Any) -> Any:
        self._write()
        return self.fs.rm(*args, **kwargs)

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if "w" in mode:
            self._write()
        return self.fs.open(path, mode, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


def test_a_commit_cut_at_any_write_on_an_object_store_is_never_listed(
    s3_endpoint: str,
) -> None:
    """An object store has no atomic rename: the shards are moved one by one and the
    manifest written last. Cut at each write of that protocol (a step saved again, so
    the old folder's removal is in it too), a fresh reader lists the step only once the
    commit is whole, and what it lists verifies."""
    url = f"s3://{BUCKET}/jobs/cut/checkpoints"
    names = ["__0_0.distcp", "__1_0.distcp", ".metadata"]

    def stage(store: CheckpointStore) -> dict[str, dict[str, Any]]:
        staging = store.staging_path(5)
        for i, name in enumerate(names):
            with store.fs.open(f"{staging}/{name}", "wb") as f:
                f.write(bytes([i]) * (1000 + i))
        return store.checksums(staging, names)

    first = CheckpointStore(url)
    first.commit(5, stage(first), {})  # step 5 exists: the next commit replaces it
    at = 1
    while True:
        store = CheckpointStore(url)
        files = stage(store)
        store.fs = CrashingFs(store.fs, at)
        try:
            store.commit(5, files, {"attempt": at})
        except Crash:
            listed = CheckpointStore(url).committed()
            for ckpt in listed:  # whatever is listed is whole
                assert CheckpointStore(url).verify(ckpt, names) is None, (at, ckpt.manifest)
            at += 1
            continue
        break
    assert at > len(names) + 1  # every move and the manifest were cut once
    listed = CheckpointStore(url).committed()
    assert [c.step for c in listed] == [5] and listed[0].manifest["attempt"] == at
