"""Client commands for stopping, continuing and reordering work: pause, resume, priority,
checkpoints."""

from __future__ import annotations

from rich.table import Table

from shardline.api.cli.common import TokenOption, UrlOption, api_errors, client, console


def pause(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """Checkpoint a RUNNING job and free its workers (it becomes PAUSED)."""
    with api_errors(), client(url, token) as c:
        job = c.pause(job_id)
    console.print(f"{job['id']}  {job['state']}")


def resume(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """Queue a PAUSED job again; it continues from its checkpoint."""
    with api_errors(), client(url, token) as c:
        job = c.resume(job_id)
    console.print(f"{job['id']}  {job['state']}")


def priority(job_id: str, value: int, url: UrlOption = None, token: TokenOption = None) -> None:
    """Give a job that has not ended a new priority (queued jobs start highest first; an
    administrator may raise it, an owner may lower their own)."""
    with api_errors(), client(url, token) as c:
        job = c.set_priority(job_id, value)
    console.print(f"{job['id']}  {job['state']}  priority {job['priority']}")


def checkpoints(job_id: str, url: UrlOption = None, token: TokenOption = None) -> None:
    """List a job's committed checkpoints."""
    with api_errors(), client(url, token) as c:
        rows = c.checkpoints(job_id)
    table = Table("step", "committed", "bytes", "save s", "held s", "layout", "path")
    for r in rows:
        table.add_row(
            str(r["step"]),
            r["created_at"][:19],
            f"{r['bytes']:,}",
            "" if r["save_s"] is None else f"{r['save_s']:.2f}",
            "" if r["blocking_s"] is None else f"{r['blocking_s']:.3f}",
            r["layout"],
            r["path"],
        )
    console.print(table)
