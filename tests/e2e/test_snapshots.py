"""In-memory snapshots on a real local Ray cluster: with no storage checkpoint until the
end, a worker killed mid-run costs at most `memory_every_steps` steps, the losses are an
uninterrupted run's, and the snapshots are gone when the job ends."""

from __future__ import annotations

import os
import signal
import stat
from typing import Any

import pytest

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import train_local
from tests.e2e.conftest import resumed, wait_for, worker_pid
from tests.e2e.test_recovery import (
    LIMIT_S,
    STEPS,
    ServiceFactory,
    assert_trained_like,
    finished,
)

MEMORY_EVERY = 3

BODY: dict[str, Any] = {
    "name": "e2e-snapshots",
    "model": {"preset": "tiny", "seq_len": 32},
    "parallel": {"dp": 2, "zero_stage": 2},
    "train": {
        "steps": STEPS,
        "global_batch_size": 4,
        "micro_batch_size": 1,
        "lr": 3e-3,
        "log_every": 1,
        "seed": 11,
    },
    # No storage checkpoint before the last step: only a snapshot can save the run.
    "checkpoint": {"every_steps": 0, "memory_every_steps": MEMORY_EVERY},
    "fault_tolerance": {"max_failures": 2, "hang_timeout_s": 120},
}


@pytest.fixture(scope="module")
def reference() -> list[dict[str, Any]]:
    metrics: list[dict[str, Any]] = []
    train_local(JobSpec.model_validate(BODY), 2, on_metrics=metrics.append)
    return metrics


def test_worker_killed_resumes_from_the_snapshot_in_memory(
    service: ServiceFactory, reference: list[dict[str, Any]]
) -> None:
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(BODY)
        wait_for(c, job["id"], lambda j: j["step"] >= 8, LIMIT_S)
        snapshots = svc.settings.job_layout(job["id"]).snapshot_dir
        assert snapshots.is_dir()  # one host: the snapshots live here
        # The model's whole state in host memory: no other local user may enter.
        assert stat.S_IMODE(snapshots.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(snapshots.stat().st_mode) == 0o700
        os.kill(worker_pid(svc.ray_address, job["id"], 1), signal.SIGKILL)
        done = finished(c, job["id"])
        assert done["state"] == "SUCCEEDED", "\n".join(e["message"] for e in c.events(job["id"]))
        assert (done["restarts"], done["failures"]) == (1, 1)
        assert_trained_like(c, job["id"], reference)
        # From host memory (no storage checkpoint exists before the end), after step 6
        # at the earliest (killed at step 8 or later, snapshots every 3 steps).
        resumed(c, job["id"], tier="memory", after_at_least=6, lost_at_most=MEMORY_EVERY)
        events = c.events(job["id"], after=0)
        checkpoints = c.checkpoints(job["id"])
    messages = [e["message"] for e in events]
    restored = [e for e in events if e["message"].startswith("restored checkpoint step")]
    assert len(restored) == 1 and restored[0]["data"]["tier"] == "memory", messages
    assert restored[0]["data"]["step"] >= MEMORY_EVERY, messages
    recovered = [e for e in events if e["message"].startswith("recovered in")]
    assert len(recovered) == 1, messages
    assert recovered[0]["data"]["steps_lost"] <= MEMORY_EVERY, recovered[0]
    print(recovered[0]["message"])  # the MTTR measured, for docs/benchmarks.md
    # Snapshots are never reported as checkpoints, and are removed with the job.
    assert [ck["step"] for ck in checkpoints] == [STEPS]
    assert not snapshots.exists()
