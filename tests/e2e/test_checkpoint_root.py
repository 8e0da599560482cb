"""A service whose checkpoints live on object storage (a local S3 server): a job pauses,
the control plane stops and starts again, the job resumes from S3 and ends with every
step's loss equal to an uninterrupted run; its checkpoint exports from S3 too."""

from __future__ import annotations

import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import ray

from shardline.service.local_ray import start_local_ray
from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from shardline.workers.storage.checkpoints import CheckpointStore
from tests.e2e.conftest import Service, job_spec, new_service, wait_for
from tests.support.databases import fresh_database
from tests.support.ray_head import CLUSTER_CPUS, attached
from tests.support.s3 import BUCKET, local_s3

STEPS = 40
LIMIT_S = 300.0
ROOT = f"s3://{BUCKET}/service"
BODY = job_spec("e2e-s3", steps=STEPS, seed=7)


@pytest.fixture
def s3_service(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Service]:
    """A Ray head started after the S3 variables are set, with the operator's switch that
    passes the credentials on (the service's Ray processes get none by default): the
    workers read them from their own environment, as on a node configured for the bucket."""
    with ExitStack() as stack:
        stack.enter_context(local_s3(monkeypatch, tmp_path / "moto.log"))
        monkeypatch.setenv("SHARDLINE_PASS_STORAGE_CREDENTIALS", "1")
        if ray.is_initialized():  # this process may be connected to the tier's own head
            ray.shutdown()
        head = start_local_ray(tmp_path / "ray-state", CLUSTER_CPUS)
        stack.callback(head.stop)
        stack.enter_context(attached(head))  # the tier's head stays reachable after
        url = stack.enter_context(fresh_database("sqlite", tmp_path))
        yield new_service(url, head.address, tmp_path, checkpoint_root=ROOT)


def test_a_job_pauses_to_s3_and_resumes_after_a_control_plane_restart(
    s3_service: Service, tmp_path: Path
) -> None:
    reference: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(BODY), 2, on_metrics=reference.append)
    svc = s3_service
    with svc.running() as server, svc.client(server) as c:
        job = c.submit(BODY)
        wait_for(c, job["id"], lambda j: j["step"] >= 3, LIMIT_S)
        c.pause(job["id"])
        paused = wait_for(c, job["id"], lambda j: j["state"] == "PAUSED", LIMIT_S)
        listed = c.checkpoints(job["id"])
    at = listed[0]["step"]
    assert 3 <= at < STEPS, listed
    # The checkpoint is on S3, and nothing of it on the server's disk.
    store = CheckpointStore(f"{ROOT}/{job['id']}/checkpoints")
    assert [ckpt.step for ckpt in store.committed()] == [at]
    # Users see the path inside the job's folder, wherever the server keeps it.
    assert paused["latest_checkpoint"] == listed[0]["path"] == f"checkpoints/step-{at:08d}"
    assert not (tmp_path / "storage" / job["id"] / "checkpoints").exists()

    with svc.running() as server, svc.client(server) as c:  # a new control plane
        assert c.get(job["id"])["state"] == "PAUSED"
        c.resume(job["id"])
        done = wait_for(
            c, job["id"], lambda j: j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED"), LIMIT_S
        )
        assert done["state"] == "SUCCEEDED", done
        metrics = c.metrics(job["id"])
        events = [e["message"] for e in c.events(job["id"], after=0)]
        archive = c.export(job["id"], tmp_path / "model.zip")

    assert any(f"restored checkpoint step {at}" in e for e in events), events
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    for got, want in zip(metrics, reference, strict=True):
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-6), f"step {got['step']}"
    assert STEPS in [ckpt.step for ckpt in store.committed()]
    with zipfile.ZipFile(archive) as z:
        assert "config.json" in z.namelist(), z.namelist()
