"""A real server over a real database, once on SQLite and once on PostgreSQL.

One database and server per backend for the whole module run; tests stay independent by
creating their own users (a user sees only their own jobs).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from shardline.api.client import Client
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from tests.support.databases import fresh_database
from tests.support.server import RunningServer, run_server


@dataclass
class Backend:
    kind: str
    url: str
    server: RunningServer
    users: UserDirectory
    db: Database

    def new_user(self, admin: bool = False) -> tuple[str, str]:
        """A fresh user and a token of theirs: (name, token)."""
        name = f"user-{uuid.uuid4().hex[:8]}"
        issued = self.users.issue_token(self.users.ensure_user(name, admin=admin), "test")
        return name, issued.token

    def client(self, token: str) -> Client:
        return Client(self.server.url, token)


@pytest.fixture(scope="session", params=["sqlite", "postgresql"])
def backend(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Backend]:
    folder: Path = tmp_path_factory.mktemp(f"api-{request.param}")
    with fresh_database(request.param, folder) as url:
        upgrade_to_head(url)
        settings = Settings(
            database_url=url,
            state_dir=folder / "state",
            data_roots=[folder / "data"],
            max_body_bytes=64 * 1024,
        )
        db = Database(url)
        with run_server(settings) as server:
            yield Backend(request.param, url, server, UserDirectory(db), db)
        db.dispose()


@pytest.fixture
def user_client(backend: Backend) -> Iterator[Callable[..., Client]]:
    clients: list[Client] = []

    def make(admin: bool = False) -> Client:
        _, token = backend.new_user(admin=admin)
        clients.append(backend.client(token))
        return clients[-1]

    yield make
    for c in clients:
        c.close()
