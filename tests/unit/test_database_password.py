"""SHARDLINE_DATABASE_PASSWORD: the database password apart from the URL, so that any
character works in it (docker-compose.yml passes POSTGRES_PASSWORD this way), and the
secrets a deployment may not start with."""

from __future__ import annotations

import pytest
from pydantic import SecretStr, ValidationError
from sqlalchemy import create_engine, make_url, text

from shardline.service.config import MIN_SECRET_CHARS, Settings
from shardline.service.migrate import upgrade_to_head
from tests.support.databases import fresh_postgres, postgres_admin_url

# Every character a URL gives a meaning to, and a percent sign that looks encoded.
AWKWARD = "p@ss/w:rd%40%zz?#&=+ é'\"\\"


def test_the_password_goes_into_the_url_encoded_and_comes_back_whole() -> None:
    settings = Settings(
        database_url="postgresql+psycopg://shardline@postgres:5432/shardline",
        database_password=SecretStr(AWKWARD),
    )
    url = make_url(settings.resolved_database_url)
    assert url.password == AWKWARD
    assert (url.host, url.port, url.database, url.username) == (
        "postgres",
        5432,
        "shardline",
        "shardline",
    )
    assert AWKWARD not in repr(settings)  # SecretStr: the field itself is masked


def test_it_replaces_a_password_in_the_url() -> None:
    settings = Settings(database_url="postgresql://u:old@h/d", database_password=SecretStr(AWKWARD))
    assert make_url(settings.database_url).password == AWKWARD


def test_it_is_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHARDLINE_DATABASE_URL", "postgresql+psycopg://shardline@db/shardline")
    monkeypatch.setenv("SHARDLINE_DATABASE_PASSWORD", AWKWARD)
    assert make_url(Settings().database_url).password == AWKWARD


def test_without_it_the_url_is_as_given() -> None:
    given = "postgresql+psycopg://u:short@h:5/d"
    assert Settings(database_url=given).database_url == given  # existing URLs keep working
    assert Settings().database_password is None


@pytest.mark.parametrize("weak", ["change-me", "Change-Me", " changeme ", "password", "x" * 15])
def test_a_placeholder_or_short_password_is_refused(
    monkeypatch: pytest.MonkeyPatch, weak: str
) -> None:
    monkeypatch.setenv("SHARDLINE_DATABASE_URL", "postgresql://u@h/d")
    monkeypatch.setenv("SHARDLINE_DATABASE_PASSWORD", weak)
    with pytest.raises(ValidationError) as refused:
        Settings()
    [error] = refused.value.errors()
    assert "\n" not in error["msg"]
    assert "SHARDLINE_DATABASE_PASSWORD" in error["msg"]
    assert "openssl rand -hex 24" in error["msg"]
    if len(weak) == MIN_SECRET_CHARS - 1:
        assert "shorter than" in error["msg"]
    else:
        assert "placeholder" in error["msg"]
    # What was given is never shown: a real, if short, password would be.
    assert "input_value" not in str(refused.value)


def test_a_password_without_a_url_is_refused() -> None:
    with pytest.raises(ValidationError, match="SHARDLINE_DATABASE_URL is not"):
        Settings(database_password=SecretStr("y" * 24))
    with pytest.raises(ValidationError, match="not a database URL"):
        Settings(database_url="not a url", database_password=SecretStr("y" * 24))


@pytest.mark.parametrize("weak", ["change-me", "short"])
def test_a_placeholder_ray_token_is_refused_for_a_cluster(
    monkeypatch: pytest.MonkeyPatch, weak: str
) -> None:
    monkeypatch.setenv("RAY_AUTH_TOKEN", weak)
    # A local head uses a token file of its own: RAY_AUTH_TOKEN is not its token.
    assert Settings().ray_address == ""
    with pytest.raises(ValidationError, match=r"RAY_AUTH_TOKEN .*openssl rand -hex 24"):
        Settings(ray_address="ray://ray-head:10001")
    monkeypatch.setenv("RAY_AUTH_TOKEN", "z" * 32)
    assert Settings(ray_address="ray://ray-head:10001").ray_auth_token is not None


def test_an_awkward_password_connects_to_postgresql() -> None:
    """On the test server (trust authentication: the password is not checked), the URL
    built from it keeps host, port, database and role, and psycopg accepts it."""
    admin = postgres_admin_url()
    if admin is not None and admin.password is not None:
        pytest.skip("the test server checks passwords; this test needs trust authentication")
    with fresh_postgres() as database:
        given = make_url(database)
        settings = Settings(database_url=database, database_password=SecretStr(AWKWARD))
        url = make_url(settings.resolved_database_url)
        assert url.password == AWKWARD
        assert (url.host, url.port, url.database, url.username) == (
            given.host,
            given.port,
            given.database,
            given.username,
        )
        engine = create_engine(settings.resolved_database_url)
        try:
            with engine.connect() as conn:
                assert conn.scalar(text("SELECT current_database()")) == given.database
        finally:
            engine.dispose()


def test_an_awkward_password_migrates() -> None:
    admin = postgres_admin_url()
    if admin is not None and admin.password is not None:
        pytest.skip("the test server checks passwords; this test needs trust authentication")
    with fresh_postgres() as database:
        settings = Settings(database_url=database, database_password=SecretStr(AWKWARD))
        upgrade_to_head(settings.resolved_database_url)
