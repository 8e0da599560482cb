"""Running Alembic from code: `shardline serve` migrates before it serves.

The migrations ship in the wheel as the package `shardline.migrations`, and this module is the
whole Alembic configuration, so an installed wheel migrates from any working directory;
the top-level alembic.ini is only for running `alembic` by hand in a checkout.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

from shardline import migrations

MIGRATIONS_DIR = Path(migrations.__file__).resolve().parent


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # Alembic's config is a ConfigParser: a URL-encoded password's % must be doubled.
    cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


def upgrade_to_head(database_url: str) -> None:
    command.upgrade(alembic_config(database_url), "head")


def downgrade_to_base(database_url: str) -> None:
    command.downgrade(alembic_config(database_url), "base")
