"""GET /v1/jobs/{id}/export: a job's checkpoint as a Hugging Face Llama folder, zipped.

The conversion reads the torch.distributed.checkpoint files, which needs torch, and the
control plane never imports torch (tests/unit/test_control_plane_imports.py): so the export
runs in a child process (`python -m workers.engine.hf_export`), which also keeps a large
model's memory out of the API process and frees it when the export ends. The folder it
writes is zipped (stored, not compressed: weights barely compress) into a temporary file
that is streamed back and deleted after the response.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from api.deps import CurrentUser, SettingsDep, StoreDep
from api.errors import ApiError
from api.openapi import error_responses
from service.config import Settings
from workers.contract.data_access import DataAccess
from workers.storage.checkpoints import CommittedCheckpoint

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 404, 422))

# A big model takes a while to convert; beyond this something is wrong.
EXPORT_TIMEOUT_S = 3600.0
MAX_STEP = 2**63 - 1


def _checkpoint(settings: Settings, job_id: str, step: int | None) -> CommittedCheckpoint:
    ckpt = settings.job_layout(job_id).checkpoints().find(step)
    if ckpt is None:
        which = f"at step {step}" if step is not None else "yet"
        raise ApiError(
            404,
            "not_found",
            f"job {job_id} has no committed checkpoint {which}; list them with "
            f"GET /v1/jobs/{job_id}/checkpoints",
        )
    return ckpt


def _run_export(ckpt: CommittedCheckpoint, out: Path, settings: Settings) -> None:
    """The conversion, in a child process that reads files only the job could read."""
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    env = {**os.environ, **access.env_vars()}
    command = [sys.executable, "-m", "workers.engine.hf_export", ckpt.path, str(out)]
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=EXPORT_TIMEOUT_S
        )
    except subprocess.TimeoutExpired:
        raise ApiError(
            503, "unavailable", f"the export did not finish in {EXPORT_TIMEOUT_S:.0f}s"
        ) from None
    if done.returncode == 2:  # a checkpoint that cannot be exported: the reason is for the user
        raise ApiError(422, "export_failed", done.stderr.strip()[-2000:] or "export failed")
    if done.returncode != 0:
        log.error("export of %s failed: %s", ckpt.path, done.stderr[-4000:])
        raise ApiError(503, "unavailable", "the export failed on the server; see its log")


def _zip_folder(folder: Path, archive: Path) -> None:
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as zf:
        for path in sorted(folder.iterdir()):
            zf.write(path, arcname=path.name)


@router.get(
    "/{job_id}/export",
    response_class=FileResponse,
    responses={
        200: {
            "content": {"application/zip": {}},
            "description": "config.json, safetensors weights and tokenizer files, zipped",
        },
        **error_responses(503),
    },
)
def export_job(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    step: Annotated[int | None, Query(ge=1, le=MAX_STEP)] = None,
) -> FileResponse:
    """A committed checkpoint (`step`, or the newest) as a Hugging Face Llama folder in a
    zip: `transformers.AutoModelForCausalLM.from_pretrained` loads it unpacked."""
    job = store.get(job_id, user)
    ckpt = _checkpoint(settings, job.id, step)
    exports = settings.job_layout(job.id).exports_dir
    exports.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="export-", dir=exports))
    try:
        out = workdir / "model"
        _run_export(ckpt, out, settings)
        archive = workdir / "model.zip"
        _zip_folder(out, archive)
        shutil.rmtree(out)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    return FileResponse(
        archive,
        media_type="application/zip",
        filename=f"{job.id}-step-{ckpt.step}.zip",
        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True),
    )
