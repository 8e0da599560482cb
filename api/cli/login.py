"""`shardline login` and `shardline logout`: the server and token for every later command
and for `Client.from_env()`, saved for this user (mode 0600), usable from any folder."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from shardline.api.cli.common import api_errors, console, fail, load_settings
from shardline.api.client import Client
from shardline.api.credentials import (
    TOKEN_ENV,
    URL_ENV,
    BadSetting,
    config_file,
    default_url,
    forget_credentials,
    save_credentials,
)
from shardline.service.config import Settings


def login(
    url: Annotated[
        str | None,
        typer.Option("--url", help="Server address (default: SHARDLINE_URL, then this host's)."),
    ] = None,
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            help="API token (default: SHARDLINE_TOKEN, then ./.shardline/admin-token, "
            "then asked for).",
        ),
    ] = None,
) -> None:
    """Save the server and token for this user's commands, from any folder.

    Checks that they work first. `Client.from_env()` uses them too."""
    settings = load_settings()
    try:
        url = url or os.environ.get(URL_ENV) or default_url()
    except BadSetting as err:
        raise fail([str(err)]) from None
    token = token or os.environ.get(TOKEN_ENV) or _local_admin_token(settings)
    if not token:
        token = typer.prompt("API token", hide_input=True).strip()
    if not token:
        raise fail(["no token given; pass --token or paste one when asked"])
    with api_errors(), Client(url, token, token_source="the token given to login") as c:
        c.list(limit=1)  # an invalid token or a wrong address fails here, not later
    path = config_file()
    save_credentials(url, token, path)
    console.print(f"Logged in to {url}; saved to {path} (mode 0600).")


def logout() -> None:
    """Forget the saved server and token."""
    path = config_file()
    if forget_credentials(path):
        console.print(f"Removed {path}.")
    else:
        console.print(f"Not logged in ({path} does not exist).")


def _local_admin_token(settings: Settings) -> str | None:
    """The admin token `shardline serve` saved in this folder, if it is the server's."""
    path = settings.resolved_admin_token_file
    return path.read_text().strip() if path.is_file() else None
