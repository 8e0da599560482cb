"""`shardline demo`: the service end to end on this machine, then shut down cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from shardline.api.cli.common import api_errors, console, fail, read_spec
from shardline.api.cli.watching import follow_job
from shardline.api.credentials import BadSetting, default_url


def demo(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml")] = Path("examples/demo.yaml"),
    state_dir: Annotated[
        Path, typer.Option(help="Embedded state (SQLite, storage, token).")
    ] = Path(".shardline"),
) -> None:
    """Start the service here, train SPEC to the end, then stop it.

    SQLite and a local Ray head in STATE_DIR; the job goes through the SDK like any other."""
    from shardline.api.local_service import local_service

    spec = read_spec(spec_path)
    console.print(f"Starting Shardline (state in {state_dir}/) ...")
    with local_service(state_dir) as svc, api_errors(), svc.client() as client:
        console.print(f"Service up at {svc.url}; submitting {spec_path}")
        token_file = (state_dir / "admin-token").absolute()
        console.print(
            f"The admin token is in {token_file}; the CLI finds it when run from this "
            f"folder. From any other: shardline login --url {svc.url} --token "
            f'"$(cat {token_file})"',
            soft_wrap=True,
        )
        job = client.submit(spec)
        # The page link while the server is up to show it; after the run it is stopped.
        console.print(f"Watch it at {svc.url}/#/jobs/{job['id']} while it runs.", soft_wrap=True)
        final = follow_job(client, job["id"], job["steps"])
        summary = next(
            (e["data"] for e in client.events(job["id"]) if e["kind"] == "summary"), None
        )
        console.print(f"Job {final['id']} {final['state']} after {final['step']} steps")
        if summary is not None:
            typer.echo(json.dumps(summary, sort_keys=True))
        console.print("Stopping the service ...")
    console.print(
        f"Stopped. The job is kept in {state_dir}/: `SHARDLINE_STATE_DIR={state_dir} "
        f".venv/bin/shardline serve` shows it again at {_serve_url()}/#/jobs/{final['id']}.",
        soft_wrap=True,
    )
    if final["state"] != "SUCCEEDED":
        raise fail([f"job ended {final['state']}: {final.get('failure_reason')}"], code=1)


def _serve_url() -> str:
    """Where `shardline serve` here would answer (its defaults, or SHARDLINE_HOST/PORT)."""
    try:
        return default_url()
    except BadSetting:  # serve would refuse it too, and say so
        return "http://127.0.0.1:8000"
