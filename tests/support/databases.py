"""Real databases for tests: a SQLite file, or a fresh PostgreSQL database per test run."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text

# The PostgreSQL server of the development and CI machines (trust auth).
PG_ADMIN_URL = os.environ.get(
    "SHARDLINE_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/test"
)


def postgres_unavailable() -> str | None:
    """Why PostgreSQL tests cannot run here, or None when a server answers."""
    try:
        engine = create_engine(PG_ADMIN_URL, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        engine.dispose()
    except Exception as err:
        return f"no PostgreSQL server answers at {PG_ADMIN_URL}: {type(err).__name__}"
    return None


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A new, empty database on the test server; dropped afterwards."""
    name = f"shardline_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield PG_ADMIN_URL.rsplit("/", 1)[0] + f"/{name}"
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@contextmanager
def fresh_database(kind: str, folder: Path) -> Iterator[str]:
    """The URL of a new, empty database of `kind` ("sqlite" or "postgresql")."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'shardline-{uuid.uuid4().hex[:8]}.db'}"
    else:
        with fresh_postgres() as url:
            yield url
