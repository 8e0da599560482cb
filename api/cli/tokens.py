"""`shardline token ...`: manage users' API tokens directly in the server's database."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from shardline.api.cli.common import console, err_console, fail, load_settings
from shardline.api.credentials import default_url
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory

tokens_app = typer.Typer(
    no_args_is_help=True,
    help="Create, list and revoke API tokens (run where the server's database is reachable).",
)


def _directory() -> tuple[UserDirectory, Database]:
    """The server's users, in its database; never a new, empty database no server uses
    (a token made there would work nowhere)."""
    settings = load_settings()
    if not settings.database_url:
        sqlite_file = settings.state_dir / "shardline.db"
        if not sqlite_file.is_file():
            raise fail(
                [
                    f"no server database here ({sqlite_file} does not exist): run this where "
                    "`shardline serve` runs, or set SHARDLINE_DATABASE_URL (or "
                    "SHARDLINE_STATE_DIR) to the server's"
                ],
                code=1,
            )
    url = settings.resolved_database_url
    upgrade_to_head(url)
    db = Database(url)
    return UserDirectory(db), db


@tokens_app.command("create")
def create(
    name: Annotated[str, typer.Option("--name", help="The user's name.")],
    admin: Annotated[bool, typer.Option("--admin", help="Make the user an admin.")] = False,
) -> None:
    """Create a token for user NAME (created if needed); prints the token once."""
    if not name or len(name) > 64 or not name.replace("-", "").replace("_", "").isalnum():
        raise fail(["--name: 1 to 64 letters, digits, - or _"])
    users, db = _directory()
    try:
        existing = users.find_user(name)
        if existing is not None and existing.is_admin and not admin:
            # Its token would be an admin token: say so rather than hand one out unasked.
            raise fail(
                [
                    f"--name {name}: that user is an admin, so its token would be an admin "
                    "token; pass --admin if you mean that, or choose another name"
                ]
            )
        issued = users.issue_token(users.ensure_user(name, admin=admin), name=f"{name}-cli")
    finally:
        db.dispose()
    typer.echo(issued.token)
    # Where the person it is for logs in with it (stderr: stdout is the token alone).
    err_console.print(
        f"To use it: shardline login --url {default_url()} --token {issued.token}",
        soft_wrap=True,
        highlight=False,
    )


@tokens_app.command("list")
def list_tokens() -> None:
    """Every token: id, user, prefix, state (never the secret)."""
    users, db = _directory()
    try:
        rows = users.list_tokens()
    finally:
        db.dispose()
    table = Table("id", "user", "name", "prefix", "created", "revoked")
    for t in rows:
        table.add_row(
            str(t.id),
            t.user,
            t.name,
            t.prefix + "...",
            str(t.created_at)[:19],
            "yes" if t.revoked else "",
        )
    console.print(table)


@tokens_app.command("revoke")
def revoke(token_id: Annotated[int, typer.Argument(help="Id from `token list`.")]) -> None:
    """Revoke a token: requests with it get 401 at once on PostgreSQL, within
    SHARDLINE_READ_CACHE_S (1 s) on SQLite."""
    users, db = _directory()
    try:
        revoked = users.revoke(token_id)
    finally:
        db.dispose()
    if not revoked:
        raise fail([f"no live token with id {token_id}"], code=1)
    console.print(
        f"revoked token {token_id}: running servers refuse it at once on PostgreSQL, "
        "within the time they keep a token on SQLite (SHARDLINE_READ_CACHE_S, 1 s by default)"
    )
