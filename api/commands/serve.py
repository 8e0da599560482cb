"""`shardline serve`: migrate the database, make sure an admin exists, serve the API."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from api.commands.common import console

log = logging.getLogger(__name__)


def serve(
    host: Annotated[str | None, typer.Option(help="Address to bind (SHARDLINE_HOST).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (SHARDLINE_PORT).")] = None,
) -> None:
    """Run the control plane on this machine's embedded defaults or SHARDLINE_* settings."""
    import uvicorn

    from api.app import create_app
    from service.config import Settings
    from service.db import Database
    from service.migrate import upgrade_to_head
    from service.users import UserDirectory, bootstrap_admin

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = Settings(**overrides)  # type: ignore[arg-type]
    url = settings.resolved_database_url
    upgrade_to_head(url)
    db = Database(url)
    try:
        token = bootstrap_admin(UserDirectory(db), settings.resolved_admin_token_file)
    finally:
        db.dispose()
    if token is not None:
        console.print(f"Created user 'admin'. Its API token is shown once:\n  {token}\n"
                      f"(saved with mode 0600 to {settings.resolved_admin_token_file}, where "
                      "the CLI finds it)")
    console.print(f"Shardline API on http://{settings.host}:{settings.port} "
                  f"(docs at /docs)", soft_wrap=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port,
                log_level="warning")
