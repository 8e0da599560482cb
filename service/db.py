"""Database engine and sessions: SQLite (embedded) or PostgreSQL, same code."""

from __future__ import annotations

import functools
import importlib.util
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import orjson
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.orm import Session, sessionmaker

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncEngine

T = TypeVar("T")


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
# Threads of one process inside the database at once (ConcurrencyGate). 4 measured best on
# 2 cores for SQLite and PostgreSQL alike; more only adds waiting for Python's turn.
DB_CONCURRENCY = 4
# Pooled connections: one per thread the gate lets in, and room for the engine used
# around it (migrations, tests). Fewer than are used at once means busy moments open and
# close a connection per request (a PostgreSQL backend to start; a SQLite file to open and
# set pragmas on under its lock).
POOL_SIZE = 10
POOL_OVERFLOW = 10
# Connections for reads awaited on the event loop: more readers than this wait for one
# (without a thread) rather than open more PostgreSQL backends.
ASYNC_POOL_SIZE = 8


def load_stored_json(text: str | bytes) -> Any:
    """A stored JSON column's value: orjson decodes a job's spec several times faster than
    the stdlib, which every status read and listing paid for; rows written before specs
    and metrics refused non-finite floats hold `NaN`, which only the stdlib reads."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return json.loads(text)


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
            json_deserializer=load_stored_json,
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    engine = create_engine(
        url,
        pool_size=POOL_SIZE,
        max_overflow=POOL_OVERFLOW,
        pool_timeout=POOL_TIMEOUT_S,
        connect_args=_postgres_connect_args(statement_timeout_s),
        json_deserializer=load_stored_json,
    )
    event.listen(engine.pool, "checkin", _stamp_checkin)
    event.listen(engine.pool, "checkout", _ping_if_idle)
    return engine


# A pooled connection idle longer than this is pinged before use: one the server dropped
# (restart, failover) is replaced, so the API recovers by itself when the database is back.
# One used more recently is not (pool_pre_ping would ping every checkout, a round trip per
# read): if the server went away within that second, the statement fails as a disconnect,
# SQLAlchemy drops every pooled connection, and that one request gets a 503.
PING_IDLE_S = 1.0


def _postgres_connect_args(statement_timeout_s: float | None) -> dict[str, Any]:
    connect_args: dict[str, Any] = {"connect_timeout": CONNECT_TIMEOUT_S}
    if statement_timeout_s is not None:
        connect_args["options"] = f"-c statement_timeout={int(statement_timeout_s * 1000)}"
    return connect_args


def make_async_reads_engine(url: str, statement_timeout_s: float | None) -> AsyncEngine | None:
    """An engine for reads awaited on the event loop (`Database.read_async`), where the
    driver has an asyncio form (psycopg 3); None where it has not. Its own small pool:
    connections it holds are never handed to a thread."""
    if not url.startswith("postgresql+psycopg:") or importlib.util.find_spec("greenlet") is None:
        return None
    # Imported here: only the API awaits reads, and the import costs every other process
    # (the CLI, migrations) about 60 ms.
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(
        url,
        pool_size=ASYNC_POOL_SIZE,
        max_overflow=0,
        pool_timeout=POOL_TIMEOUT_S,
        connect_args=_postgres_connect_args(statement_timeout_s),
        json_deserializer=load_stored_json,
        isolation_level="AUTOCOMMIT",
    )
    event.listen(engine.sync_engine.pool, "checkin", _stamp_checkin)
    event.listen(engine.sync_engine.pool, "checkout", _ping_if_idle)
    return engine


def _stamp_checkin(_dbapi_conn: Any, record: Any) -> None:
    record.info["checked_in_at"] = time.monotonic()


def _ping_if_idle(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    idle_since = record.info.get("checked_in_at")
    if idle_since is None or time.monotonic() - idle_since < PING_IDLE_S:
        return  # new (just connected), or in use a moment ago
    try:
        with dbapi_conn.cursor() as cur:
            cur.execute("SELECT 1")
        dbapi_conn.rollback()
    except Exception as err:
        # The pool discards this connection and checks out (or opens) another.
        raise sa_exc.DisconnectionError(f"pooled connection is gone: {err}") from err


class ConcurrencyGate:
    """At most `limit` threads of this process inside the database at once; the others
    wait (asleep, not competing). Python runs one thread at a time, and a database call
    hands that turn back and forth at every statement and row: with 32 request threads in
    it at once, a listing cost 3.6 ms of CPU instead of 1.0 ms, the difference spent
    trading the turn. Re-entrant per thread, so a call inside another never waits on
    itself; a wait past `timeout_s` is the pool's own TimeoutError (the API's 503)."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit, self.timeout_s = limit, timeout_s
        self._slots = threading.BoundedSemaphore(limit)
        self._depth = threading.local()

    @contextmanager
    def held(self) -> Iterator[None]:
        depth: int = getattr(self._depth, "n", 0)
        if depth == 0 and not self._slots.acquire(timeout=self.timeout_s):
            raise sa_exc.TimeoutError(
                f"{self.limit} database calls of this process were still running after "
                f"{self.timeout_s:g} s"
            )
        self._depth.n = depth + 1
        try:
            yield
        finally:
            self._depth.n = depth
            if depth == 0:
                self._slots.release()


# The reader a thread (or a task's greenlet, see `async_reads`) has open, per database: a
# context variable rather than a thread-local, so reads interleaved on one event loop
# thread never see each other's connection.
_READING: ContextVar[tuple[Database, Connection] | None] = ContextVar("reading", default=None)


@contextmanager
def _reading_on(db: Database, conn: Connection) -> Iterator[None]:
    token = _READING.set((db, conn))
    try:
        yield
    finally:
        _READING.reset(token)


class Database:
    """An engine and its session factory, entered through one ConcurrencyGate."""

    def __init__(
        self,
        url: str,
        statement_timeout_s: float | None = STATEMENT_TIMEOUT_S,
        concurrency: int = DB_CONCURRENCY,
    ) -> None:
        self.url = url
        self.engine = make_engine(url, statement_timeout_s)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self.gate = ConcurrencyGate(concurrency, POOL_TIMEOUT_S)
        self._autocommit_reads = self.engine.dialect.name != "sqlite"
        # A read of a few rows need not hop to a thread, which costs more than the read.
        # On SQLite it may run where it is asked for, on the API's event loop: in WAL mode
        # a reader never waits for the writer, and the file is local. A PostgreSQL read is
        # a round trip to a server and may wait on a lock (a migration's) for the
        # statement timeout, so it must never block the loop: it is awaited there on an
        # asyncio connection where psycopg's asyncio form is installed (`read_async`).
        self.reads_inline = self.engine.dialect.name == "sqlite"
        self._statement_timeout_s = statement_timeout_s

    @functools.cached_property
    def async_reads(self) -> AsyncEngine | None:
        """The engine of `read_async`, made at its first use (None where there is none)."""
        return make_async_reads_engine(self.url, self._statement_timeout_s)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self.gate.held(), self.sessions() as session:
            yield session

    @contextmanager
    def reader(self, *, gated: bool = True) -> Iterator[Connection]:
        """A Core connection for reads that need no ORM objects (see job_views.py), in
        autocommit on PostgreSQL: no transaction to begin or roll back, which saves a round
        trip each time one goes back to the pool (SQLite begins none for a read anyway, and
        setting and resetting its isolation level cost more than the read). Each statement
        sees its own snapshot: read what must agree in one statement.

        Re-entrant per thread (and per `read_async` call): a reader opened inside another
        shares its connection, so a request that authenticates and reads takes one
        connection and one gate slot.
        `gated=False` is for the event loop's own inline reads (`reads_inline`): the gate
        bounds the threads that trade Python's turn, and the loop must never wait on it
        behind writers waiting for SQLite's lock."""
        held = _READING.get()
        if held is not None and held[0] is self:
            yield held[1]
            return
        with self.gate.held() if gated else nullcontext(), self.engine.connect() as conn:
            if self._autocommit_reads:
                conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            with _reading_on(self, conn):
                yield conn

    async def read_async(self, read: Callable[[], T]) -> T:
        """`read()` on a connection of `async_reads`, awaited: the same synchronous code as
        in a thread, its statements awaited on the event loop (SQLAlchemy runs it in a
        greenlet), so a polled read costs no hop to a thread and back. Every `reader()`
        opened inside it shares that connection, as in a thread."""
        if self.async_reads is None:
            raise RuntimeError(f"{self.engine.dialect.name} has no asyncio reads here")

        def on(conn: Connection) -> T:
            with _reading_on(self, conn):
                return read()

        async with self.async_reads.connect() as conn:
            return await conn.run_sync(on)

    def dispose(self) -> None:
        self.engine.dispose()
        if (made := self._made_async_reads()) is not None:
            # Outside the event loop its connections cannot be closed politely; the
            # server sees them go with the process (`dispose_async` closes them first).
            made.sync_engine.dispose(close=False)

    async def dispose_async(self) -> None:
        if (made := self._made_async_reads()) is not None:
            await made.dispose()
        self.dispose()

    def _made_async_reads(self) -> AsyncEngine | None:
        """The engine of `read_async` if a read made it (disposing must not make one)."""
        made: AsyncEngine | None = self.__dict__.get("async_reads")
        return made
