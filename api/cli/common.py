"""What the CLI's commands share: consoles, error exits, reading specs, the API client."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from api.client import Client
from service.config import Settings
from workers.contract.spec import JobSpec, describe_errors, load_spec

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url", envvar="SHARDLINE_URL", help="Server address (default http://127.0.0.1:8000)."
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="SHARDLINE_TOKEN",
        help="API token (default: the admin token saved by `shardline serve`).",
    ),
]


def step_progress(disable: bool = False) -> Progress:
    """The progress bar of a training run on stderr: steps done of total, and a status."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[status]}"),
        TimeElapsedColumn(),
        console=err_console,
        disable=disable,
    )


def fail(lines: list[str], code: int = 2) -> typer.Exit:
    for line in lines:
        err_console.print(f"[red]error:[/red] {line}")
    return typer.Exit(code)


def read_spec(path: Path) -> JobSpec:
    """Load a spec file, turning every problem into a readable error and exit code 2."""
    try:
        return load_spec(path)
    except FileNotFoundError:
        raise fail([f"{path}: no such file"]) from None
    except ValidationError as err:
        raise fail([f"{path}: {line}" for line in describe_errors(err)]) from None
    except (ValueError, OSError) as err:  # YAML syntax errors are ValueErrors
        raise fail([f"{path}: {err}"]) from None


def client(url: str | None, token: str | None) -> Client:
    """A client for the server, with the token from the option, env, or the admin file."""
    settings = Settings()
    if token is None:
        token_file = settings.resolved_admin_token_file
        if not token_file.is_file():
            raise fail(
                [
                    f"no token: pass --token, set SHARDLINE_TOKEN, or run "
                    f"`shardline serve` here first (it saves one to {token_file})"
                ]
            )
        token = token_file.read_text().strip()
    host = "127.0.0.1" if settings.host in ("0.0.0.0", "::") else settings.host
    return Client(url or os.environ.get("SHARDLINE_URL") or f"http://{host}:{settings.port}", token)
