"""With the embedded defaults the state dir (admin token, database) lies inside the data
root; no job may name it, or a folder holding it, as data. Errors never show the roots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.config import Settings
from service.db import Database
from service.migrate import upgrade_to_head
from service.users import UserDirectory
from tests.support.server import RunningServer, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str, Path]]:
    root = tmp_path_factory.mktemp("workdir")
    state = root / ".shardline"
    state.mkdir()
    (state / "admin-token").write_text("sl_secret")
    (root / "corpus").mkdir()
    (root / "corpus" / "a.txt").write_text("hello\n")
    url = f"sqlite:///{state / 'shardline.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user("mallory"), "test").token
    settings = Settings(database_url=url, state_dir=state, data_roots=[root])
    with run_server(settings) as running:
        yield running, token, root
    db.dispose()


def submit(server: tuple[RunningServer, str, Path], data: dict[str, Any]) -> httpx.Response:
    running, token, _ = server
    return httpx.post(
        f"{running.url}/v1/jobs",
        content=json.dumps({"name": "x", "data": data, "model": {"vocab_size": 256}}),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"source": "tokens", "path": "{root}/.shardline/admin-token"}, "data.path"),
        ({"source": "tokens", "path": "{root}/corpus/../.shardline/shardline.db"}, "data.path"),
        ({"source": "text", "path": "{root}/.shardline/storage"}, "data.path"),
        ({"source": "text", "path": "{root}"}, "data.path"),  # a folder walk would reach it
        (
            {"source": "text", "path": "{root}/corpus", "tokenizer": "{root}/.shardline/x.json"},
            "data.tokenizer",
        ),
        ({"source": "text", "path": "{root}/corpus", "tokenizer": "/etc/passwd"}, "data.tokenizer"),
    ],
)
def test_the_services_own_files_are_never_data(
    server: tuple[RunningServer, str, Path], data: dict[str, str], field: str
) -> None:
    root = server[2]
    response = submit(server, {k: v.format(root=root) for k, v in data.items()})
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["details"][0]["field"] == field
    assert "sl_secret" not in response.text


def test_refusals_do_not_show_the_servers_roots(server: tuple[RunningServer, str, Path]) -> None:
    response = submit(server, {"source": "text", "path": "/etc"})
    assert response.status_code == 422
    assert str(server[2]) not in response.text


def test_a_folder_of_text_inside_the_root_is_accepted(
    server: tuple[RunningServer, str, Path],
) -> None:
    response = submit(server, {"source": "text", "path": f"{server[2]}/corpus"})
    assert response.status_code == 201, response.text
