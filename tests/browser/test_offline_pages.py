"""Issue 14: every page the service serves works with no internet."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import expect

from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from tests.browser.conftest import Sandboxed
from tests.support.server import RunningServer, run_server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, str]]:
    folder = tmp_path_factory.mktemp("offline")
    url = f"sqlite:///{folder / 'shardline.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user("offline", admin=True), "browser").token
    with run_server(Settings(database_url=url, state_dir=folder / "state")) as running:
        yield running, token
    db.dispose()


def test_docs_render_operations_without_leaving_the_host(
    server: tuple[RunningServer, str], sandboxed_page: Sandboxed
) -> None:
    running, _ = server
    page = sandboxed_page.page
    page.goto(f"{running.url}/docs")
    submit = page.locator(".opblock-post", has=page.locator('[data-path="/v1/jobs"]'))
    expect(submit).to_be_visible(timeout=20_000)
    expect(submit).to_contain_text("POST")
    page.wait_for_load_state("networkidle")
    assert sandboxed_page.outside == []


def test_redoc_renders_without_leaving_the_host(
    server: tuple[RunningServer, str], sandboxed_page: Sandboxed
) -> None:
    running, _ = server
    page = sandboxed_page.page
    page.goto(f"{running.url}/redoc")
    expect(page.get_by_text("/v1/jobs/{job_id}/cancel").first).to_be_attached(timeout=20_000)
    expect(page.get_by_text("Something went wrong")).to_have_count(0)
    page.wait_for_load_state("networkidle")
    assert sandboxed_page.outside == []
    # ReDoc always shows Redocly's logo from their CDN; the page's policy stops it.
    assert all("redoc.ly" in url for url in sandboxed_page.stopped_by_policy)


def test_status_page_renders_without_leaving_the_host(
    server: tuple[RunningServer, str], sandboxed_page: Sandboxed, tmp_path: Path
) -> None:
    running, token = server
    page = sandboxed_page.page
    page.goto(running.url + "/")
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()
    expect(page.locator("#no-jobs")).to_be_visible()
    page.wait_for_load_state("networkidle")
    assert sandboxed_page.outside == []
