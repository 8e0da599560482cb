"""What a new user trips on, driven through the CLI against the real server: each
mistake is a non-zero exit, at most five lines, no traceback, and names what to fix.
Then logging in once and using the CLI from any folder."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from shardline.api.cli.app import app
from tests.api.conftest import Backend

# One database is enough: these are about the CLI's words, not the store.
pytestmark = pytest.mark.parametrize("backend", ["sqlite"], indirect=True)
# In this process (a subprocess per command would cost a second each); an exception
# that escaped the CLI would be result.exception here, where a user sees a traceback.
RUNNER = CliRunner()


def run(*args: str, env: dict[str, str], cwd: Path) -> Result:
    unset: dict[str, str | None] = {k: None for k in os.environ if k.startswith("SHARDLINE_")}
    here = Path.cwd()
    os.chdir(cwd)
    try:
        return RUNNER.invoke(app, list(args), env={**unset, "COLUMNS": "80", **env})
    finally:
        os.chdir(here)


def refused(result: Result, *words: str) -> str:
    """The error of a refused command, checked to be short, plain and on point."""
    err = result.stderr
    assert result.exit_code != 0, result.stdout + err
    assert isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in err and 1 <= len(err.strip().splitlines()) <= 5, err
    for word in words:
        assert word in err, err
    return err


@pytest.fixture
def user(backend: Backend, tmp_path: Path) -> dict[str, str]:
    """A user's environment: server and token in the environment, a config home of its
    own, running in an empty folder."""
    _, token = backend.new_user()
    (tmp_path / "config").mkdir()
    return {
        "SHARDLINE_URL": backend.server.url,
        "SHARDLINE_TOKEN": token,
        "XDG_CONFIG_HOME": str(tmp_path / "config"),
    }


def test_spec_file_mistakes(user: dict[str, str], tmp_path: Path) -> None:
    def submit(text: str) -> Result:
        (tmp_path / "job.yaml").write_text(text)
        return run("submit", "job.yaml", env=user, cwd=tmp_path)

    refused(submit("name: x\ntrain:\n  steps: [1, 2\n"), "job.yaml: YAML syntax error at line 4")
    refused(submit("name: x\ntrain: {step: 5}\n"), "train.step", "did you mean `train.steps`?")
    refused(submit("name: my job\n"), "name: use only letters", "no spaces")
    refused(run("submit", ".", env=user, cwd=tmp_path), "is a folder")
    refused(run("submit", "nope.yaml", env=user, cwd=tmp_path), "nope.yaml: no such file")


def test_a_missing_corpus_is_refused_at_submit(
    backend: Backend, user: dict[str, str], tmp_path: Path
) -> None:
    missing = backend.server.settings.data_roots[0] / "corpus" / "missing.txt"
    (tmp_path / "job.yaml").write_text(f"name: x\ndata: {{source: text, path: {missing}}}\n")
    err = refused(run("submit", "job.yaml", env=user, cwd=tmp_path), "data.path")
    assert "does not exist; give a file or folder inside the data roots" in err


def test_logs_of_a_rank_the_job_does_not_have(user: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: one-rank\n")
    job_id = run("submit", "job.yaml", env=user, cwd=tmp_path).stdout.split()[0]
    assert run("logs", job_id, env=user, cwd=tmp_path).exit_code == 0
    refused(run("logs", job_id, "--rank", "3", env=user, cwd=tmp_path), "rank", "1 rank (0)")


def test_bad_and_missing_tokens_say_where_they_came_from(
    user: dict[str, str], tmp_path: Path
) -> None:
    stale = {**user, "SHARDLINE_TOKEN": "stale"}
    refused(run("jobs", env=stale, cwd=tmp_path), "unauthorized", "came from SHARDLINE_TOKEN")
    nothing = {"XDG_CONFIG_HOME": user["XDG_CONFIG_HOME"]}
    refused(run("jobs", env=nothing, cwd=tmp_path), "no API token", "shardline login")


def test_login_once_then_the_cli_works_from_any_folder(
    backend: Backend, user: dict[str, str], tmp_path: Path
) -> None:
    issued = backend.users.issue_token(backend.users.ensure_user("logs-in-once"), "laptop")
    url, token = user["SHARDLINE_URL"], issued.token
    only_config = {"XDG_CONFIG_HOME": user["XDG_CONFIG_HOME"]}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    refused(
        run("login", "--url", url, "--token", "wrong", env=only_config, cwd=elsewhere),
        "unauthorized",
    )
    assert not (tmp_path / "config" / "shardline" / "credentials.json").exists()

    logged = run("login", "--url", url, "--token", token, env=only_config, cwd=elsewhere)
    assert logged.exit_code == 0, logged.stderr
    saved = tmp_path / "config" / "shardline" / "credentials.json"
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    (elsewhere / "job.yaml").write_text("name: logged-in\n")
    submitted = run("submit", "job.yaml", env=only_config, cwd=elsewhere)
    assert submitted.exit_code == 0, submitted.stderr
    listed = run("jobs", env=only_config, cwd=tmp_path)
    assert listed.exit_code == 0 and "logged-in" in listed.stdout, listed.stderr

    # A token revoked after login: the error names the file to fix.
    assert backend.users.revoke(issued.token_id)
    refused(run("jobs", env=only_config, cwd=tmp_path), "came from", str(saved))
    assert run("logout", env=only_config, cwd=tmp_path).exit_code == 0
    assert not saved.exists()


def test_a_bad_setting_is_one_line_naming_the_variable(
    user: dict[str, str], tmp_path: Path
) -> None:
    # With no SHARDLINE_URL the CLI reads the server's port setting.
    no_url = {k: v for k, v in user.items() if k != "SHARDLINE_URL"}
    refused(run("jobs", env={**no_url, "SHARDLINE_PORT": "abc"}, cwd=tmp_path), "SHARDLINE_PORT")
    placeholder = {
        "SHARDLINE_DATABASE_URL": "postgresql+psycopg://shardline@127.0.0.1:9/shardline",
        "SHARDLINE_DATABASE_PASSWORD": "change-me",
    }
    err = refused(run("serve", env=placeholder, cwd=tmp_path), "SHARDLINE_DATABASE_PASSWORD")
    assert "placeholder" in err and "openssl rand -hex 24" in err


def test_wait_gives_up_after_its_timeout_with_124(user: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "job.yaml").write_text("name: never-runs\n")  # no runtime here: stays QUEUED
    job_id = run("submit", "job.yaml", env=user, cwd=tmp_path).stdout.split()[0]
    waited = run("wait", job_id, "--timeout", "1", env=user, cwd=tmp_path)
    assert waited.exit_code == 124, waited.stderr
    assert f"job {job_id} is still QUEUED after 1s" in waited.stderr
