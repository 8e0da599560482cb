"""With the embedded defaults the state dir (admin token, database) lies inside the data
root; no job may name it, or a folder holding it, as data. Errors never show the roots."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import ANY

import httpx
import pytest

from shardline.service.admission import Refused, check_data_paths
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from shardline.workers.contract.spec import JobSpec
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


def spec(data: dict[str, str]) -> JobSpec:
    return JobSpec.model_validate({"name": "x", "data": data})


def test_a_path_that_does_not_exist_is_refused_saying_how_it_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The server reads a relative path from its own folder: run "the server" in tmp_path.
    monkeypatch.chdir(tmp_path)
    settings = Settings(state_dir=tmp_path / ".shardline", data_roots=[tmp_path])
    (tmp_path / "corpus").mkdir()
    check_data_paths(spec({"source": "text", "path": "corpus"}), settings)
    for path, words in (
        ("corpus/missing.txt", "does not exist (a relative path is read from the server's"),
        (str(tmp_path / "gone.bin"), "does not exist; give a file or folder inside the data"),
    ):
        with pytest.raises(Refused) as err:
            check_data_paths(spec({"source": "tokens", "path": path}), settings)
        assert err.value.status == 422 and words in err.value.message, err.value.message
        assert err.value.details == [{"field": "data.path", "message": ANY}]
    with pytest.raises(Refused, match=r"model\.init_from: no-such-folder does not exist"):
        check_data_paths(
            JobSpec.model_validate({"name": "x", "model": {"init_from": "no-such-folder"}}),
            settings,
        )


def test_a_path_outside_the_roots_names_the_setting(
    server: tuple[RunningServer, str, Path],
) -> None:
    response = submit(server, {"source": "text", "path": "/etc/hostname"})
    assert response.status_code == 422
    assert "outside the data roots this server allows (SHARDLINE_DATA_ROOTS" in response.text
