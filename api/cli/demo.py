"""`shardline demo`: the service end to end on this machine, then shut down cleanly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from api.cli.common import console, fail, read_spec
from api.cli.jobs import api_errors, follow_job


def demo(
    spec_path: Annotated[Path, typer.Argument(metavar="SPEC.yaml")] = Path("examples/demo.yaml"),
    state_dir: Annotated[
        Path, typer.Option(help="Embedded state (SQLite, storage, token).")
    ] = Path(".shardline"),
) -> None:
    """Start the service (SQLite, local Ray), submit SPEC through the SDK, follow it to the
    end, print its summary, and stop everything."""
    from api.local_service import local_service

    spec = read_spec(spec_path)
    console.print(f"Starting Shardline (state in {state_dir}/) ...")
    with local_service(state_dir) as svc, api_errors(), svc.client() as client:
        console.print(f"Service up at {svc.url}; submitting {spec_path}")
        job = client.submit(spec)
        final = follow_job(client, job["id"], job["steps"])
        summary = next(
            (e["data"] for e in client.events(job["id"]) if e["kind"] == "summary"), None
        )
        console.print(f"Job {final['id']} {final['state']} after {final['step']} steps")
        if summary is not None:
            typer.echo(json.dumps(summary, sort_keys=True))
        console.print(
            f"Job page: {svc.url}/#/jobs/{final['id']} (the status page; API: "
            f"{svc.url}/v1/jobs/{final['id']}). Stopping the service ..."
        )
    if final["state"] != "SUCCEEDED":
        raise fail([f"job ended {final['state']}: {final.get('failure_reason')}"], code=1)
    console.print("Stopped.")
