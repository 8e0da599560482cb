"""Real databases for tests: a SQLite file, or a new PostgreSQL database per use.

PostgreSQL tests never rely on a pre-made database: they connect to the server's
maintenance database as a role that may create databases, create their own and drop it.
Where no server listens they are skipped with the reason (or fail, with
SHARDLINE_TEST_REQUIRE_PG=1); where a server listens but no role can create a database
they fail and say what to set, rather than skip quietly.
"""

from __future__ import annotations

import functools
import getpass
import os
import socket
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import URL, create_engine, make_url, text

URL_ENV = "SHARDLINE_TEST_PG_URL"
REQUIRE_ENV = "SHARDLINE_TEST_REQUIRE_PG"
# The PostgreSQL server of the development and CI machines.
DEFAULT_SERVER = "127.0.0.1:5432"


class PostgresUnusable(RuntimeError):
    """A server answers, but no role we may log in as can create a test database."""


def _candidates() -> list[URL]:
    """Admin URLs to try: the one configured, else the usual password-less roles (libpq
    still reads PGPASSWORD and ~/.pgpass) on the maintenance databases."""
    configured = os.environ.get(URL_ENV)
    if configured:
        return [make_url(configured)]
    host, port = DEFAULT_SERVER.split(":")
    roles = dict.fromkeys(r for r in (os.environ.get("PGUSER"), "postgres", getpass.getuser()) if r)
    return [
        URL.create("postgresql+psycopg", username=role, host=host, port=int(port), database=db)
        for role in roles
        for db in ("postgres", "template1")
    ]


def _listening(url: URL) -> bool:
    try:
        with socket.create_connection((url.host or "127.0.0.1", url.port or 5432), timeout=3):
            return True
    except OSError:
        return False


_MAY_CREATE = "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"


@functools.cache
def postgres_admin_url() -> URL | None:
    """A URL of a role that may create databases; None when no server listens."""
    candidates = _candidates()
    if not _listening(candidates[0]):
        return None
    tried = []
    for url in candidates:
        engine = create_engine(url, connect_args={"connect_timeout": 5})
        try:
            with engine.connect() as conn:
                may_create = conn.scalar(
                    text(
                        "SELECT rolcreatedb OR rolsuper FROM pg_roles WHERE rolname = current_user"
                    )
                )
            if may_create:
                return url
            tried.append(f"{url.render_as_string()}: the role may not create databases")
        except Exception as err:
            reason = str(err).strip().splitlines()[0] if str(err).strip() else ""
            tried.append(f"{url.render_as_string()}: {type(err).__name__}: {reason}")
        finally:
            engine.dispose()
    raise PostgresUnusable(
        f"a PostgreSQL server listens at {candidates[0].host}:{candidates[0].port}, but no "
        "role could create a test database:\n  " + "\n  ".join(tried) + f"\nSet {URL_ENV}="
        "postgresql+psycopg://USER:PASSWORD@HOST:PORT/postgres for a role with CREATEDB."
    )


def require_postgres() -> URL:
    """The admin URL, or skip the test (with why) when no server listens here."""
    url = postgres_admin_url()
    if url is None:
        where = _candidates()[0]
        reason = f"no PostgreSQL server listens at {where.host}:{where.port}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{reason}, and {REQUIRE_ENV}=1", pytrace=False)
        pytest.skip(f"{reason} (set {URL_ENV} to use another)")
    return url


@contextmanager
def fresh_postgres() -> Iterator[str]:
    """A new, empty database on the test server; dropped afterwards."""
    admin_url = require_postgres()
    name = f"shardline_test_{uuid.uuid4().hex[:12]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        try:
            yield admin_url.set(database=name).render_as_string(hide_password=False)
        finally:
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


@contextmanager
def fresh_database(kind: str, folder: Path) -> Iterator[str]:
    """The URL of a new, empty database of `kind` ("sqlite" or "postgresql")."""
    if kind == "sqlite":
        yield f"sqlite:///{folder / f'shardline-{uuid.uuid4().hex[:8]}.db'}"
    else:
        with fresh_postgres() as url:
            yield url


def migrated_with_token(url: str, prefix: str = "user") -> str:
    """Migrate the database at `url`, make a user in it and return a token of theirs."""
    from shardline.service.db import Database
    from shardline.service.migrate import upgrade_to_head
    from shardline.service.users import UserDirectory

    upgrade_to_head(url)
    db = Database(url)
    try:
        users = UserDirectory(db)
        return users.issue_token(
            users.ensure_user(f"{prefix}-{uuid.uuid4().hex[:6]}"), "test"
        ).token
    finally:
        db.dispose()
