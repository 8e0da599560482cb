"""What the CLI's commands share: consoles, error exits, reading specs, the API client."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from shardline.api.client import Client, ShardlineError
from shardline.api.credentials import BadSetting, NoCredentials, find_credentials
from shardline.service.config import Settings
from shardline.workers.contract.spec import JobSpec, describe_errors, load_spec
from shardline.workers.contract.spec_errors import SpecFileError

console = Console(highlight=False)
# soft_wrap: an error is one line however narrow the terminal, so it can be grepped.
err_console = Console(stderr=True, highlight=False, soft_wrap=True)

# Not typer envvars: the environment is read in find_credentials, so that an error can
# say whether the token came from --token or SHARDLINE_TOKEN.
UrlOption = Annotated[
    str | None,
    typer.Option(
        "--url",
        help="Server address (default: SHARDLINE_URL, then `shardline login`'s, then "
        "http://127.0.0.1:8000).",
    ),
]
TokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        help="API token (default: SHARDLINE_TOKEN, then `shardline login`'s, then the "
        "admin token `shardline serve` saved in ./.shardline).",
    ),
]


def step_progress(disable: bool = False) -> Progress:
    """The progress bar of a training run on stderr: steps done of total, and a status."""
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} {task.fields[status]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
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
    except IsADirectoryError:
        raise fail([f"{path}: is a folder; give the spec file (FILE.yaml)"]) from None
    except ValidationError as err:
        raise fail([f"{path}: {line}" for line in describe_errors(err)]) from None
    except SpecFileError as err:  # names the file, and the line and column for YAML
        raise fail([str(err)]) from None
    except UnicodeDecodeError:
        raise fail([f"{path}: not a text file (a spec is YAML or JSON in UTF-8)"]) from None
    except (ValueError, OSError) as err:
        raise fail([f"{path}: {err}"]) from None


def client(url: str | None, token: str | None) -> Client:
    """A client for the server, its token from --token, SHARDLINE_TOKEN, `shardline login`'s
    file or ./.shardline/admin-token; an authentication error names which."""
    try:
        found = find_credentials(url, token)
    except (NoCredentials, BadSetting) as err:
        raise fail([str(err)]) from None
    except ValidationError as err:  # a SHARDLINE_* setting the service would refuse too
        raise fail(settings_errors(err)) from None
    return Client(found.url, found.token, token_source=found.source)


def load_settings(**overrides: object) -> Settings:
    """The service's settings; a bad SHARDLINE_* value is one line per problem, exit 2."""
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as err:
        raise fail(settings_errors(err)) from None


def settings_errors(err: ValidationError) -> list[str]:
    """One line per bad setting, named as its environment variable (values never shown:
    they may be secrets)."""
    lines = []
    for e in err.errors():
        name = "_".join(str(p) for p in e["loc"]).upper()
        message = str(e["msg"]).removeprefix("Value error, ")
        lines.append(f"SHARDLINE_{name}: {message}" if name else message)
    return lines


@contextmanager
def api_errors() -> Iterator[None]:
    """Show API and connection errors as one line and exit 1, never a traceback."""
    try:
        yield
    except ShardlineError as err:
        raise fail([f"{err.code}: {err.message}"], code=1) from None
