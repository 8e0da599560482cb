"""Alembic migrations agree with the models and go up, down and up again on both databases."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, make_url, text

from shardline.service.migrate import downgrade_to_base, upgrade_to_head
from shardline.service.models import Base
from tests.support.databases import fresh_database, postgres_admin_url

TABLES = {
    "users",
    "api_tokens",
    "jobs",
    "job_events",
    "job_metrics",
    "checkpoints",
    "cluster_rates",
    "deleted_jobs",
}


@pytest.fixture(params=["sqlite", "postgresql"])
def empty_database(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with fresh_database(request.param, tmp_path) as url:
        yield url


def _tables(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        return set(inspect(engine).get_table_names()) - {"alembic_version"}
    finally:
        engine.dispose()


def test_upgrade_downgrade_upgrade(empty_database: str) -> None:
    upgrade_to_head(empty_database)
    assert _tables(empty_database) == TABLES
    downgrade_to_base(empty_database)
    assert _tables(empty_database) == set()
    upgrade_to_head(empty_database)
    assert _tables(empty_database) == TABLES


def test_models_and_migrations_agree(empty_database: str) -> None:
    upgrade_to_head(empty_database)
    engine = create_engine(empty_database)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()
    assert diff == []


def test_each_postgres_use_gets_its_own_database_and_drops_it() -> None:
    with (
        fresh_database("postgresql", Path()) as first,
        fresh_database("postgresql", Path()) as second,
    ):
        names = [make_url(first).database, make_url(second).database]
        assert names[0] != names[1]
        assert _databases() >= set(names)
    assert not _databases() & set(names)


def _databases() -> set[str]:
    admin = postgres_admin_url()
    assert admin is not None
    engine = create_engine(admin)
    try:
        with engine.connect() as conn:
            return set(conn.scalars(text("SELECT datname FROM pg_database")))
    finally:
        engine.dispose()
