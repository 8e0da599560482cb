"""The worker, not only the API, refuses files outside the data roots: a folder that the
API accepts holds a symlink to a file outside them, and the job fails saying so, without
a byte of that file in its reason or logs. Proves the roots reach the Ray workers."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from tests.e2e.conftest import Service

ServiceFactory = Callable[..., AbstractContextManager[Service]]
SECRET = "this-line-lives-outside-the-data-roots"


def test_a_symlink_out_of_the_roots_fails_the_job_in_the_worker(
    service: ServiceFactory, tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_text(f"{SECRET}\n" * 100)
    corpus = tmp_path / "corpus"  # tmp_path is the service's data root
    corpus.mkdir()
    (corpus / "a.txt").write_text("hello world\n" * 100)
    (corpus / "b.txt").symlink_to(outside)
    body = {
        "name": "reads-outside",
        "model": {"preset": "tiny", "seq_len": 32},
        "data": {"source": "text", "path": str(corpus)},
        "train": {"steps": 2, "global_batch_size": 2, "micro_batch_size": 1},
        "fault_tolerance": {"max_failures": 0},
    }
    with service() as svc, svc.running() as server, svc.client(server) as c:
        job = c.submit(body)  # the top-level folder is inside the roots: accepted
        done = c.wait(job["id"], timeout=240, poll_s=0.5)
        assert done["state"] == "FAILED", done
        reason = done["failure_reason"] or ""
        assert "DataAccessDenied" in reason and "outside the data roots" in reason, reason
        assert SECRET not in reason
        assert not any(SECRET in line for line in c.logs(job["id"], rank=0))
