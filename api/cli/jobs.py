"""Client commands: submit, jobs, status, cancel, logs, metrics."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
from rich.table import Table

from api.cli.common import (
    TokenOption,
    UrlOption,
    client,
    console,
    fail,
    read_spec,
    step_progress,
)
from api.client import TERMINAL_STATES, Client, ShardlineError


@contextmanager
def api_errors() -> Iterator[None]:
    """Show API and connection errors as one line and exit 1, never a traceback."""
    try:
        yield
    except ShardlineError as err:
        raise fail([f"{err.code}: {err.message}"], code=1) from None
    except httpx.TransportError as err:
        raise fail(
            [f"cannot reach the server ({err}); is `shardline serve` running?"], code=1
        ) from None


def submit(
    spec_path: Annotated[Path, typer.Argument(metavar="FILE.yaml")],
    follow: Annotated[bool, typer.Option("--follow", help="Show progress until it ends.")] = False,
    idempotency_key: Annotated[str | None, typer.Option(help="Submit at most once.")] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Submit a job spec; prints the job id."""
    spec = read_spec(spec_path)
    with api_errors(), client(url, token) as c:
        job = c.submit(spec, idempotency_key=idempotency_key)
        console.print(f"{job['id']}  {job['name']}  {job['state']}")
        if follow:
            final = follow_job(c, job["id"], job["steps"])
            if final["state"] != "SUCCEEDED":
                raise fail(
                    [
                        f"job {final['id']} ended {final['state']}: "
                        f"{final.get('failure_reason') or ''}"
                    ],
                    code=1,
                )


def follow_job(
    c: Client, job_id: str, steps: int, on_poll: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """A progress bar of the job's steps until it ends; returns the final job."""
    with step_progress() as progress:
        task = progress.add_task(job_id, total=steps, status="")
        while True:
            job = c.get(job_id)
            metrics = job.get("latest_metrics") or {}
            status = job["state"]
            if "loss" in metrics:
                status += f"  loss {metrics['loss']:.4f}"
            if job.get("queue_reason") and job["state"] == "QUEUED":
                status += f"  ({job['queue_reason']})"
            progress.update(task, completed=job["step"], status=status)
            if on_poll is not None:
                on_poll(job)
            if job["state"] in TERMINAL_STATES:
                return job
            time.sleep(1.0)


def jobs(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List jobs, newest first."""
    with api_errors(), client(url, token) as c:
        page = c.list(state=state, limit=limit)
    table = Table("id", "name", "owner", "state", "step", "created")
    for j in page["jobs"]:
        table.add_row(
            j["id"],
            j["name"],
            j["owner"],
            j["state"],
            f"{j['step']}/{j['steps']}",
            j["created_at"][:19],
        )
    console.print(table)


def status(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """Show one job and its recent events."""
    with api_errors(), client(url, token) as c:
        job = c.get(job_id)
        events = c.events(job_id)
    for key in (
        "id",
        "name",
        "owner",
        "state",
        "priority",
        "created_at",
        "started_at",
        "finished_at",
        "restarts",
        "failures",
        "failure_reason",
        "queue_reason",
        "latest_checkpoint",
    ):
        if job.get(key) not in (None, ""):
            console.print(f"[bold]{key}[/bold]: {job[key]}")
    console.print(f"[bold]step[/bold]: {job['step']}/{job['steps']}")
    if job.get("latest_metrics"):
        console.print(f"[bold]latest metrics[/bold]: {json.dumps(job['latest_metrics'])}")
    for e in events[-10:]:
        console.print(f"  {e['time'][:19]}  {e['kind']:<10} {e['message']}")


def cancel(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """Ask a job to stop."""
    with api_errors(), client(url, token) as c:
        job = c.cancel(job_id)
    console.print(f"{job['id']}  {job['state']}")


def logs(
    job_id: str,
    rank: Annotated[int, typer.Option(min=0)] = 0,
    tail: Annotated[int, typer.Option(min=0, max=10000)] = 200,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print the end of one rank's log; with --follow, stream it until the job ends."""
    with api_errors(), client(url, token) as c:
        lines = c.follow_logs(job_id, rank, tail) if follow else c.logs(job_id, rank, tail)
        for line in lines:
            typer.echo(line)


def metrics(
    job_id: str,
    since_step: Annotated[int, typer.Option(min=0)] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print a job's logged metrics."""
    with api_errors(), client(url, token) as c:
        rows = c.metrics(job_id, since_step=since_step)
    if as_json:
        for row in rows:
            typer.echo(json.dumps(row, sort_keys=True))
        return
    table = Table("step", "loss", "grad_norm", "lr", "tokens/s", "val_loss")

    def fmt(value: Any, spec: str) -> str:
        return "" if value is None else format(value, spec)

    for r in rows:
        table.add_row(
            str(r["step"]),
            fmt(r.get("loss"), ".4f"),
            fmt(r.get("grad_norm"), ".3f"),
            fmt(r.get("lr"), ".2e"),
            fmt(r.get("tokens_per_s"), ".0f"),
            fmt(r.get("val_loss"), ".4f"),
        )
    console.print(table)
