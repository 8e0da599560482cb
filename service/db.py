"""Database engine and sessions: SQLite (embedded) or PostgreSQL, same code."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker


def _sqlite_pragmas(dbapi_conn: Any, _record: Any) -> None:
    # WAL lets readers run beside the one writer; busy_timeout makes concurrent writers
    # wait their turn instead of failing with "database is locked".
    cur = dbapi_conn.cursor()
    cur.execute("PRAGMA journal_mode=WAL")
    cur.execute("PRAGMA busy_timeout=30000")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.close()


# A database that stops answering must turn into a quick error (the API answers 503), never
# a request that hangs: bounded connecting, waiting for a pooled connection, and statements.
CONNECT_TIMEOUT_S = 5
POOL_TIMEOUT_S = 10
STATEMENT_TIMEOUT_S = 30
# One pooled connection per thread that may use it at once: anyio's default limit of 40
# threads runs the API's sync routes. With fewer, busy moments open and close a connection
# per request (a PostgreSQL backend to start; a SQLite file to open and set pragmas on
# under its lock). A few more for the control loop's own threads.
POOL_SIZE = 40
POOL_OVERFLOW = 10


def make_engine(url: str, statement_timeout_s: float | None = None) -> Engine:
    """An engine for `url`; creates the folder of a SQLite file. `statement_timeout_s`
    bounds each PostgreSQL statement (None: no bound, as migrations need)."""
    if url.startswith("sqlite"):
        path = url.split("///", 1)[-1]
        if path and path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            url,
            pool_size=POOL_SIZE,
            max_overflow=POOL_OVERFLOW,
            pool_timeout=POOL_TIMEOUT_S,
            connect_args={"check_same_thread": False, "timeout": 30},
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if statement_timeout_s is not None:
        connect_args["options"] = f"-c statement_timeout={int(statement_timeout_s * 1000)}"
    # pre_ping: a connection the server dropped (restart, failover) is replaced on checkout,
    # so the API recovers by itself when the database is back.
    return create_engine(
        url,
        pool_pre_ping=True,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=POOL_TIMEOUT_S,
        connect_args=connect_args,
    )


class Database:
    """An engine and its session factory."""

    def __init__(self, url: str, statement_timeout_s: float | None = STATEMENT_TIMEOUT_S) -> None:
        self.url = url
        self.engine = make_engine(url, statement_timeout_s)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.sessions() as session:
            yield session

    def dispose(self) -> None:
        self.engine.dispose()
