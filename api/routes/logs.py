"""A job's logs, one file per rank: the tail (or the lines that contain some text), a
stream that follows it, and the whole file to download."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from shardline.api.deps import CurrentUser, SettingsDep, StoreDep
from shardline.api.errors import ApiError
from shardline.api.log_stream import follow_response
from shardline.api.openapi import error_responses
from shardline.api.schemas import LogsPublic
from shardline.service.config import Settings
from shardline.service.job_logs import search_lines, tail_lines
from shardline.service.models import Job
from shardline.service.principal import Viewer
from shardline.service.store import JobStore
from shardline.workers.storage.layout import JobLayout

router = APIRouter(
    prefix="/v1/jobs", tags=["jobs"], responses=error_responses(401, 404, 422, 429, 503)
)


@router.get(
    "/{job_id}/logs",
    response_model=LogsPublic,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "follow=true: a stream",
        }
    },
)
def job_logs(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    rank: Annotated[int, Query(ge=0)] = 0,
    tail: Annotated[int, Query(ge=0, le=10000)] = 200,
    contains: Annotated[str | None, Query(min_length=1, max_length=200)] = None,
    follow: bool = False,
) -> Any:
    """The last `tail` lines of one rank's log (empty until the job has run); with
    `contains`, the last `tail` lines that contain that text, case-insensitive (searched in
    the log's last 64 MiB).

    With `follow=true`, a chunked text/plain stream of those lines and every line after
    them, which ends when the job has ended.
    """
    job, layout = _rank_log(job_id, rank, user, store, settings)
    path = layout.log_file(rank)
    if follow:
        if contains is not None:
            raise ApiError(
                422,
                "validation_error",
                "contains: a followed log is not searched; leave out one of the two",
                [{"field": "contains", "message": "not with follow=true"}],
            )
        return follow_response(store, user, job.id, path, tail)
    lines = tail_lines(path, tail) if contains is None else search_lines(path, contains, tail)
    return LogsPublic(rank=rank, lines=lines, ranks=layout.log_ranks())


@router.get(
    "/{job_id}/logs/download",
    response_class=StreamingResponse,
    responses={
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "description": "the rank's whole log",
        }
    },
)
def download_log(
    job_id: str,
    user: CurrentUser,
    store: StoreDep,
    settings: SettingsDep,
    rank: Annotated[int, Query(ge=0)] = 0,
) -> StreamingResponse:
    """One rank's whole log as a file (as far as it has been written)."""
    job, layout = _rank_log(job_id, rank, user, store, settings)
    path = layout.log_file(rank)
    if not path.is_file():
        raise ApiError(404, "not_found", f"rank {rank} of job {job.id} has written no log yet")
    # The log as long as it is now: a rank may append while it is sent, and a response
    # longer than its Content-Length is cut off by the server.
    size = path.stat().st_size
    return StreamingResponse(
        _first_bytes(path, size),
        media_type="text/plain; charset=utf-8",
        headers={
            "Content-Length": str(size),
            "Content-Disposition": f'attachment; filename="{job.id}-rank-{rank}.log"',
        },
    )


def _first_bytes(path: Path, size: int, chunk: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as f:
        while size > 0 and (data := f.read(min(chunk, size))):
            size -= len(data)
            yield data


def _rank_log(
    job_id: str, rank: int, user: Viewer, store: JobStore, settings: Settings
) -> tuple[Job, JobLayout]:
    """The job (404 unless the user may see it) and its files, for a rank it has or had."""
    job = store.get(job_id, user)
    layout = settings.job_layout(job.id)
    _check_rank(rank, job.spec, layout.log_ranks())
    return job, layout


def _check_rank(rank: int, spec: dict[str, Any], logged: list[int]) -> None:
    """A rank the job has (or had: an elastic job's logs outlive its shrinking); an
    empty answer for a rank that never existed would look like a silent rank."""
    par = spec.get("parallel", {})
    world = int(par.get("dp", 1)) * int(par.get("tp", 1)) * int(par.get("pp", 1))
    if rank < world or rank in logged:
        return
    raise ApiError(
        422,
        "validation_error",
        f"rank: the job has {world} rank{'s' if world > 1 else ''} "
        f"(0{f'-{world - 1}' if world > 1 else ''}); ask for one of those",
        [{"field": "rank", "message": f"not one of the job's {world} ranks"}],
    )
