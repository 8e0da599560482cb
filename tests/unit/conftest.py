"""Fixtures of the unit tier: a real job store on a SQLite file, migrated to head."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.store import JobStore


@pytest.fixture
def store(tmp_path: Path) -> Iterator[JobStore]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    upgrade_to_head(url)
    db = Database(url)
    yield JobStore(db)
    db.dispose()
