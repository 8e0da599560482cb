"""A job saves its checkpoints to S3 (a local moto server) and resumes from them."""

from __future__ import annotations

from collections.abc import Iterator
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
