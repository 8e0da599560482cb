"""Client commands: submit, jobs, status, cancel, logs, metrics."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from shardline.api.cli.common import (
    TokenOption,
    UrlOption,
    api_errors,
    client,
    console,
    fail,
    read_spec,
)
from shardline.api.cli.watching import end_with, follow_job


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
            end_with(follow_job(c, job["id"], job["steps"]))


def jobs(
    state: Annotated[str | None, typer.Option(help="Only jobs in this state.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=1000)] = 50,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per job, one per line.")
    ] = False,
    quiet: Annotated[bool, typer.Option("-q", "--quiet", help="Only the ids.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """List jobs, newest first."""
    with api_errors(), client(url, token) as c:
        page = c.list(state=state, limit=limit)
    if quiet or as_json:
        for j in page["jobs"]:
            typer.echo(j["id"] if quiet else json.dumps(j))
        return
    table = Table()
    # Whole ids, however narrow the terminal: they are what every other command takes.
    widest = max((len(j["id"]) for j in page["jobs"]), default=2)
    table.add_column("id", no_wrap=True, min_width=widest)
    for name in ("name", "owner", "state", "step", "created"):
        table.add_column(name)
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


def delete(
    job_id: str,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask first.")] = False,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Delete an ended job: its record, events, metrics, logs and checkpoints."""
    if not yes and not typer.confirm(
        f"Delete job {job_id} with its logs, metrics and checkpoints?", default=False
    ):
        raise fail(["not deleted"], code=1)
    with api_errors(), client(url, token) as c:
        gone = c.delete(job_id)
    console.print(f"{gone['id']}  deleted")
    if not gone["files_removed"]:
        console.print("its files could not be removed; they are left for an operator")


def logs(
    job_id: str,
    rank: Annotated[int, typer.Option(min=0)] = 0,
    tail: Annotated[int, typer.Option(min=0, max=10000)] = 200,
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the job ends.")
    ] = False,
    grep: Annotated[
        str | None, typer.Option("--grep", help="Only lines that contain this (any case).")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="Save the rank's whole log here.")
    ] = None,
    url: UrlOption = None,
    token: TokenOption = None,
) -> None:
    """Print the end of one rank's log (--grep: the last lines that contain a text); with
    --follow, stream it until the job ends; with --out, save the whole log."""
    if follow and grep is not None:
        raise fail(["--grep searches what is written; it does not apply to --follow"])
    if out is not None and (follow or grep is not None):
        raise fail(["--out saves the whole log; leave out --grep and --follow with it"])
    with api_errors(), client(url, token) as c:
        if out is not None:
            c.download_log(job_id, out, rank)
            typer.echo(str(out))
            return
        lines = c.follow_logs(job_id, rank, tail) if follow else c.logs(job_id, rank, tail, grep)
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
