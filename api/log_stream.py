"""`GET /v1/jobs/{id}/logs?follow=true`: one rank's log as a chunked text stream.

Sends the last `tail` lines, then every line the rank appends, until the job has ended
and its log is drained; a "[shardline] the job is ..." line after every KEEPALIVE_S with
nothing else to send. Plain text lines over chunked transfer: `curl -N` shows it as is,
and the CLI reads it line by line.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

from starlette.concurrency import run_in_threadpool
from starlette.responses import StreamingResponse

from shardline.api.client import TERMINAL_STATES
from shardline.service.job_logs import LogFollower
from shardline.service.principal import Viewer
from shardline.service.store import JobStore

POLL_S = 0.5
# A follow that has had nothing to send for this long says so in a line of its own:
# proxies close streams that stay silent (nginx after 60 s), and the reader learns why
# nothing comes (the job is still queued, or the rank is quiet).
KEEPALIVE_S = 15.0


def follow_response(
    store: JobStore, user: Viewer, job_id: str, log_file: Path, tail: int
) -> StreamingResponse:
    """Stream `log_file` (one rank's log of job `job_id`) until the job has ended."""
    lines = _follow(store, user, job_id, LogFollower(log_file), tail)
    return StreamingResponse(
        lines,
        media_type="text/plain; charset=utf-8",
        # Proxies such as nginx would otherwise hold the stream back in their buffers.
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


async def _follow(
    store: JobStore, user: Viewer, job_id: str, follower: LogFollower, tail: int
) -> AsyncIterator[str]:
    # File and database reads block; they run in the thread pool, not on the event loop.
    if text := _chunk(await run_in_threadpool(follower.start, tail)):
        yield text
    last_sent = time.monotonic()
    while True:
        job = await run_in_threadpool(store.get, job_id, user)
        if job.state in TERMINAL_STATES:
            # The job's workers are gone: what is in the file now is all there will be.
            while True:
                if text := _chunk(await run_in_threadpool(follower.rest)):
                    yield text
                if not follower.behind:
                    return
        if text := _chunk(await run_in_threadpool(follower.read)):
            yield text
            last_sent = time.monotonic()
        elif time.monotonic() - last_sent >= KEEPALIVE_S:
            yield _waiting(job.state, job.queue_reason)
            last_sent = time.monotonic()
        if not follower.behind:  # else read on at once: the reads are bounded, not the log
            await asyncio.sleep(POLL_S)


def _waiting(state: str, queue_reason: str | None) -> str:
    why = f": {queue_reason}" if state == "QUEUED" and queue_reason else ""
    return f"[shardline] the job is {state}{why}; no new log lines for {KEEPALIVE_S:.0f} s\n"


def _chunk(lines: list[str]) -> str:
    return "".join(line + "\n" for line in lines)
