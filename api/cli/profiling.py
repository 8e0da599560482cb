"""`shardline profile`: record N steps of every rank of a running job with torch.profiler
and download them as one Chrome trace (open it in Perfetto or chrome://tracing)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from shardline.api.cli.common import (
    TokenOption,
    UrlOption,
    api_errors,
    client,
    console,
    err_console,
    fail,
)


def profile(
    job_id: str,
    steps: Annotated[int, typer.Option("--steps", min=1, max=20, help="Steps to record.")] = 3,
    out: Annotated[Path, typer.Option("-o", "--out", help="Where the trace goes.")] = Path(
        "trace.json"
    ),
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the ranks.")] = 300.0,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Profile the next STEPS steps of a RUNNING job on every rank; writes one Chrome trace
    (each rank a process named "rank R"). Training goes on meanwhile."""
    with api_errors(), client(url, token) as c:
        started = c.profile(job_id, steps)
        with err_console.status(f"recording {steps} steps on {started['world_size']} rank(s)"):
            done = c.wait_for_profile(job_id, started["id"], timeout=timeout)
        if done["state"] != "done":
            raise fail([f"profile {done['id']} failed: {done['error']}"], code=1)
        c.profile_trace(job_id, done["id"], out)
    console.print(f"{out}  profile {done['id']}: {steps} steps of {done['world_size']} rank(s)")
