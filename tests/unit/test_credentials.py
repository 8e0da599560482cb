"""Where the CLI and the SDK find their server and token: flags, the environment, the
saved login, the admin token of the current folder, in that order, each named."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from shardline.api.client import Client
from shardline.api.credentials import (
    NoCredentials,
    config_file,
    find_credentials,
    forget_credentials,
    read_saved,
    save_credentials,
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An empty folder to run in and an empty config home, with no SHARDLINE_* set."""
    for name in ("SHARDLINE_URL", "SHARDLINE_TOKEN", "SHARDLINE_STATE_DIR", "SHARDLINE_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("SHARDLINE_ADMIN_TOKEN_FILE", raising=False)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return {"XDG_CONFIG_HOME": str(tmp_path / "config")}


def test_each_source_in_order_and_named(home: dict[str, str], tmp_path: Path) -> None:
    admin = tmp_path / "cwd" / ".shardline" / "admin-token"
    admin.parent.mkdir()
    admin.write_text("admin-token\n")
    found = find_credentials(environ=home)
    assert (found.url, found.token, found.source) == (
        "http://127.0.0.1:8000",
        "admin-token",
        str(Path(".shardline/admin-token")),
    )

    saved = config_file(home)
    save_credentials("http://saved:1", "saved-token", saved)
    found = find_credentials(environ=home)
    assert (found.url, found.token, found.source) == ("http://saved:1", "saved-token", str(saved))

    env = {**home, "SHARDLINE_TOKEN": "env-token", "SHARDLINE_URL": "http://env:2"}
    found = find_credentials(environ=env)
    assert (found.url, found.token, found.source) == (
        "http://env:2",
        "env-token",
        "SHARDLINE_TOKEN",
    )

    found = find_credentials("http://flag:3", "flag-token", environ=env)
    assert (found.url, found.token, found.source) == ("http://flag:3", "flag-token", "--token")


def test_no_token_anywhere_says_where_it_looked(home: dict[str, str]) -> None:
    with pytest.raises(NoCredentials) as err:
        find_credentials(environ=home)
    message = str(err.value)
    assert "SHARDLINE_TOKEN" in message and "shardline login" in message
    assert str(config_file(home)) in message and "admin-token" in message


def test_the_saved_login_is_private_and_can_be_forgotten(home: dict[str, str]) -> None:
    path = config_file(home)
    save_credentials("http://h:1", "secret", path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert read_saved(path) == {"url": "http://h:1", "token": "secret"}
    assert forget_credentials(path) and not path.exists()
    assert not forget_credentials(path)
    path.write_text("not json")
    assert read_saved(path) == {}
    path.parent.chmod(0o755)  # opened to others since
    save_credentials("http://h:1", "secret", path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700


def test_a_client_without_a_token_says_how_to_give_one() -> None:
    with pytest.raises(ValueError, match=r"no API token.*Client\.from_env"):
        Client("http://127.0.0.1:9", "")
