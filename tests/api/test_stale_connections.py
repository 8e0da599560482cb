"""A pooled PostgreSQL connection the server dropped is replaced before use once it has
sat idle (service/db.py pings those), so the first read after a failover just works."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from sqlalchemy import text

from shardline.service import db as db_module
from shardline.service.db import Database
from tests.support.databases import fresh_database
from tests.support.event_loops import run_async


def test_an_idle_connection_the_server_dropped_is_replaced_before_use(tmp_path: Path) -> None:
    with fresh_database("postgresql", tmp_path) as url:
        db = Database(url)
        try:
            with db.reader() as conn:
                doomed = conn.scalar(text("SELECT pg_backend_pid()"))
            # The server ends that backend (a restart, a failover, an admin's kill).
            killer = Database(url)
            with killer.reader() as conn:
                assert conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": doomed})
            killer.dispose()
            time.sleep(db_module.PING_IDLE_S + 0.2)
            with db.reader() as conn:  # the same pooled connection, found dead and replaced
                assert conn.scalar(text("SELECT pg_backend_pid()")) != doomed
            with db.session() as s:
                assert s.scalar(text("SELECT 1")) == 1
        finally:
            db.dispose()


def test_the_async_reads_replace_a_dropped_connection_and_share_one_inside(
    tmp_path: Path,
) -> None:
    with fresh_database("postgresql", tmp_path) as url:
        db = Database(url)
        assert db.async_reads is not None  # psycopg 3: the polled reads are awaited

        def backend_pids() -> tuple[int, int]:
            with db.reader() as outer, db.reader() as inner:
                return (
                    outer.scalar(text("SELECT pg_backend_pid()")),
                    inner.scalar(text("SELECT pg_backend_pid()")),
                )

        async def scenario() -> None:
            doomed, inside = await db.read_async(backend_pids)
            assert inside == doomed  # a reader opened inside shares the awaited connection
            with db.reader() as conn:  # a thread's read takes the other pool
                assert conn.scalar(text("SELECT pg_backend_pid()")) != doomed
            killer = Database(url)
            with killer.reader() as conn:
                assert conn.scalar(text("SELECT pg_terminate_backend(:pid)"), {"pid": doomed})
            killer.dispose()
            await asyncio.sleep(db_module.PING_IDLE_S + 0.2)
            replaced, _ = await db.read_async(backend_pids)
            assert replaced != doomed
            await db.dispose_async()

        run_async(scenario)
