"""The OpenAPI document as a client generator reads it: openapi-python-client generates a
client from it with no warning, every response typed, a job's state as an enum and its
times as date-times; and the generated client reads what the API answers."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from shardline.api.app import create_app
from shardline.api.schemas import JobPublic
from shardline.service.config import Settings
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.lifecycle import JobState
from shardline.workers.contract.spec import JobSpec

GENERATOR = Path(sys.executable).parent / "openapi-python-client"
# The export is a zip, which the generator reads as bytes when told so; its own formatter
# (ruff on PATH) is not what is being tested.
CONFIG = "post_hooks: []\ncontent_type_overrides:\n  application/zip: application/octet-stream\n"


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("openapi")
    app = create_app(Settings(state_dir=folder, database_url=f"sqlite:///{folder}/x.db"), None)
    (folder / "openapi.json").write_text(json.dumps(app.openapi()))
    (folder / "config.yaml").write_text(CONFIG)
    done = subprocess.run(
        [
            str(GENERATOR),
            "generate",
            "--path",
            "openapi.json",
            "--output-path",
            "client",
            "--config",
            "config.yaml",
        ],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    said = done.stdout + done.stderr
    assert "Warning" not in said and "WARNING" not in said, said
    return folder / "client"


def test_every_response_is_typed_and_a_job_s_state_is_an_enum(generated: Path) -> None:
    (package,) = [p for p in generated.iterdir() if (p / "models").is_dir()]
    job = (package / "models" / "job_public.py").read_text()
    assert "state: JobState" in job and "created_at: datetime.datetime" in job
    states = (package / "models" / "job_state.py").read_text()
    assert all(f'{s.value} = "{s.value}"' in states for s in JobState)


def test_the_generated_client_reads_a_job_as_the_api_writes_it(
    generated: Path, store: JobStore
) -> None:
    owner = UserDirectory(store.db).ensure_user("alice")
    job, _ = store.create(owner, JobSpec.model_validate({"name": "typed"}))
    answer = json.loads(JobPublic.of(store.get(job.id)).model_dump_json())
    sys.path.insert(0, str(generated))
    try:
        (package,) = [p.name for p in generated.iterdir() if (p / "models").is_dir()]
        models = importlib.import_module(f"{package}.models")
        read = models.JobPublic.from_dict(answer)
        assert read.state == models.JobState.QUEUED
        assert read.created_at.tzinfo is not None  # UTC, and said so
    finally:
        sys.path.remove(str(generated))


def test_each_operation_is_tagged_with_what_it_is_about(generated: Path) -> None:
    doc = json.loads((generated.parent / "openapi.json").read_text())
    tags = {
        (method.upper(), path): op.get("tags")
        for path, ops in doc["paths"].items()
        for method, op in ops.items()
    }
    assert tags[("PATCH", "/v1/jobs/{job_id}")] == ["jobs"]
    assert tags[("GET", "/v1/cluster")] == ["cluster"]
    assert all(t and len(t) == 1 for t in tags.values()), tags
