"""`shardline migrate`: bring the database to the newest schema, then exit."""

from __future__ import annotations

from shardline.api.cli.common import console


def migrate() -> None:
    """Apply the Alembic migrations shipped in the package to SHARDLINE_DATABASE_URL.

    `shardline serve` does the same before it serves; this is for deployments that
    migrate as a separate step.
    """
    from shardline.service.config import Settings
    from shardline.service.migrate import upgrade_to_head

    settings = Settings()
    upgrade_to_head(settings.resolved_database_url)
    console.print("database is at the newest schema")
