"""GET /v1/jobs/{id}/export: a job's checkpoint as a Hugging Face folder of its family, zipped.

The conversion reads the torch.distributed.checkpoint files, which needs torch, and the
control plane never imports torch (tests/unit/test_control_plane_imports.py): so the export
runs in a child process (`python -m shardline.workers.engine.hf_export`), which also keeps a large
model's memory out of the API process and frees it when the export ends. The child also
zips the folder it writes (stored, not compressed: weights barely compress) into a
temporary file, at a lower priority than the server, so that a busy host answers
/healthz and status reads first; the file is streamed back and deleted after the
response.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse
from starlette.background import BackgroundTask

from shardline.api.deps import CurrentUser, ExportsDep, SettingsDep, StoreDep
from shardline.api.errors import ApiError
from shardline.api.openapi import error_responses
from shardline.service.admission import checkpoint_storage
from shardline.service.config import Settings
from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.sections import MAX_STEPS
from shardline.workers.storage.checkpoints import CheckpointStore, CommittedCheckpoint

log = logging.getLogger(__name__)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 404, 422))

# A big model takes a while to convert; beyond this something is wrong.
EXPORT_TIMEOUT_S = 3600.0
# How much lower than the server an export's conversion runs (nice(1) levels).
EXPORT_NICENESS = 10
# A pin outlives the export by this much (a pin left by a server that died lapses then).
PIN_MARGIN_S = 600.0


def _checkpoint(checkpoints: CheckpointStore, job_id: str, step: int | None) -> CommittedCheckpoint:
    ckpt = checkpoints.find(step)
    if ckpt is None:
        which = f"at step {step}" if step is not None else "yet"
        raise ApiError(
            404,
            "not_found",
            f"job {job_id} has no committed checkpoint {which}; list them with "
            f"GET /v1/jobs/{job_id}/checkpoints",
        )
    return ckpt


async def _run_export(
    ckpt: CommittedCheckpoint, out: Path, archive: Path, settings: Settings
) -> None:
    """The conversion and the zip, in a child process that reads files only the job could
    read. The route awaits it on the event loop: no thread of the pool that serves every
    other request waits on it, and none of the server's threads hold its GIL for it."""
    access = DataAccess.of(settings.data_roots, settings.private_dirs)
    env = {**os.environ, **access.env_vars()}
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "shardline.workers.engine.hf_export",
        ckpt.path,
        str(out),
        "--zip",
        str(archive),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )
    # Background work: on a busy host the API's own answers (/healthz, status reads) come
    # first. (Set from here, not in a preexec_fn, which is unsafe with the server's threads.)
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, child.pid, EXPORT_NICENESS)
    try:
        _, raw = await asyncio.wait_for(child.communicate(), EXPORT_TIMEOUT_S)
    except TimeoutError:
        child.kill()
        await child.wait()
        raise ApiError(
            503, "unavailable", f"the export did not finish in {EXPORT_TIMEOUT_S:.0f}s"
        ) from None
    finally:
        if child.returncode is None:  # the client went away: stop converting for nobody
            child.kill()
            await child.wait()
    stderr = raw.decode("utf-8", errors="replace")
    if child.returncode == 2:  # a checkpoint that cannot be exported: the reason is for the user
        # Named as the job's step: the server's storage path is not the user's business.
        reason = stderr.strip()[-2000:].replace(ckpt.path, f"step {ckpt.step}")
        raise ApiError(422, "export_failed", reason or "export failed")
    if child.returncode != 0:
        log.error("export of %s failed: %s", ckpt.path, stderr[-4000:])
        raise ApiError(503, "unavailable", "the export failed on the server; see its log")


@router.get(
    "/{job_id}/export",
    response_class=FileResponse,
    responses={
        200: {
            "content": {"application/zip": {"schema": {"type": "string", "format": "binary"}}},
            "description": "config.json, safetensors weights and tokenizer files, zipped",
        },
        **error_responses(409, 429, 503),
    },
)
async def export_job(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    slots: ExportsDep,
    step: Annotated[int | None, Query(ge=1, le=MAX_STEPS)] = None,
) -> FileResponse:
    """A committed checkpoint (`step`, or the newest) as a Hugging Face folder of its family in a
    zip: `transformers.AutoModelForCausalLM.from_pretrained` loads it unpacked. The
    checkpoint is kept from the job's retention (`keep_last`) while it is read."""
    job = await run_in_threadpool(store.get, job_id, user)
    loop = asyncio.get_running_loop()
    async with slots.slot(user.id):
        layout = settings.job_layout(job.id)
        checkpoints = layout.checkpoints()
        with checkpoint_storage(job.id, ApiError):
            ckpt, pin = await loop.run_in_executor(
                slots.executor, _pinned_checkpoint, checkpoints, job.id, step
            )
        layout.exports_dir.mkdir(parents=True, exist_ok=True)
        workdir = Path(tempfile.mkdtemp(prefix="export-", dir=layout.exports_dir))
        try:
            archive = workdir / "model.zip"
            await _run_export(ckpt, workdir / "model", archive, settings)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        finally:
            checkpoints.unpin(pin)
    return FileResponse(
        archive,
        media_type="application/zip",
        filename=f"{job.id}-step-{ckpt.step}.zip",
        background=BackgroundTask(shutil.rmtree, workdir, ignore_errors=True),
    )


def _pinned_checkpoint(
    checkpoints: CheckpointStore, job_id: str, step: int | None
) -> tuple[CommittedCheckpoint, str]:
    """The checkpoint to export, pinned against the job's retention (which deletes old
    ones as the job saves new ones), and the pin. Found again once pinned: retention may
    have deleted it between the listing and the pin; then the newest is taken again, or
    where the request named the step, it is gone."""
    for _ in range(3):
        ckpt = _checkpoint(checkpoints, job_id, step)
        pin = checkpoints.pin(ckpt.step, EXPORT_TIMEOUT_S + PIN_MARGIN_S)
        if checkpoints.find(ckpt.step) is not None:
            return ckpt, pin
        checkpoints.unpin(pin)
    raise ApiError(
        409, "conflict", f"job {job_id}'s checkpoints are being replaced too fast; retry"
    )
