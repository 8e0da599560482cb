"""The cluster page in real Chromium against a real server and database (no Ray: queued
jobs stay queued, so the queue holds still): an admin moves a job up the queue from the
page, and every page fits a 390 px wide phone screen."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from sqlalchemy import update

from shardline.api.client import Client, NotFound
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.models import Job
from shardline.service.users import UserDirectory
from tests.browser.conftest import PHONE, Sandboxed
from tests.browser.test_status_page import long_job, sign_in
from tests.support.server import run_server


@pytest.fixture
def admin_server(tmp_path: Path) -> Iterator[tuple[Settings, str, str]]:
    """Settings, an admin's token and a user's token."""
    url = f"sqlite:///{tmp_path / 'shardline.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    admin = users.issue_token(users.ensure_user("root", admin=True), "browser").token
    user = users.issue_token(users.ensure_user("alice"), "browser").token
    db.dispose()
    yield Settings(database_url=url, state_dir=tmp_path / "state"), admin, user


def queue_names(page: Page) -> list[str]:
    return page.locator("#queue tbody td[data-label=Name]").all_inner_texts()


def test_an_admin_moves_a_queued_job_up_from_the_cluster_page(
    admin_server: tuple[Settings, str, str], sandboxed_page: Sandboxed
) -> None:
    settings, admin, user = admin_server
    page = sandboxed_page.page
    with run_server(settings) as server, Client(server.url, user) as alice:
        for name in ("first", "second", "third"):
            alice.submit(long_job(name))
        sign_in(page, server.url, admin)
        page.get_by_role("link", name="Cluster").click()
        expect(page.locator("#cluster-summary")).to_contain_text("no runtime is attached")
        expect(page.locator("#no-nodes")).to_have_text("No cluster attached.")
        names = page.locator("#queue tbody td[data-label=Name]")
        expect(names).to_have_text(["first", "second", "third"])
        page.get_by_label("Priority of third").fill("")
        page.locator('#queue tr[data-job-id] button:has-text("Set")').nth(2).click()
        expect(page.locator("#queue-error")).to_contain_text("give a whole number")
        page.get_by_label("Priority of third").fill("5")
        page.get_by_label("Priority of third").press("Tab")
        page.locator('#queue tr[data-job-id] button:has-text("Set")').nth(2).click()
        expect(names).to_have_text(["third", "first", "second"])
        assert [j["priority"] for j in alice.list()["jobs"] if j["name"] == "third"] == [5]
        # The owner may not raise her own: the page says why and the order stays.
        page.get_by_role("button", name="Log out").click()
        sign_in(page, server.url, user)
        page.get_by_role("link", name="Cluster").click()
        expect(names).to_have_text(["third", "first", "second"])
        page.get_by_label("Priority of second").fill("9")
        page.locator('#queue tr[data-job-id] button:has-text("Set")').nth(2).click()
        expect(page.locator("#queue-error")).to_contain_text("only an administrator can raise")
        expect(names).to_have_text(["third", "first", "second"])
    assert sandboxed_page.outside == []


def no_sideways_scroll(page: Page, what: str) -> None:
    width = page.evaluate("() => [document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"{what}: {width[0]} px wide in a {width[1]} px screen"


def test_every_page_fits_a_phone(
    admin_server: tuple[Settings, str, str], sandboxed_page: Sandboxed
) -> None:
    settings, admin, _ = admin_server
    page = sandboxed_page.page
    page.set_viewport_size(PHONE)  # type: ignore[arg-type]
    with run_server(settings) as server, Client(server.url, admin) as api:
        job = api.submit(long_job("a-job-with-a-rather-long-name-that-wraps-on-a-phone"))
        page.goto(server.url + "/")
        expect(page.get_by_label("API token")).to_be_visible()
        no_sideways_scroll(page, "sign-in")
        sign_in(page, server.url, admin)
        expect(page.locator("#jobs tbody tr")).to_have_count(1)
        no_sideways_scroll(page, "job list")
        # A log with a line far wider than the screen: it wraps, never cut off.
        log = settings.job_layout(job["id"]).log_file(0)
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("step 1 loss 5.0\nWARNING " + "x" * 3000 + "\nstep 2 loss 4.0\n")
        page.goto(f"{server.url}/#/jobs/{job['id']}")
        expect(page.locator("#job-state")).to_have_text("QUEUED")
        expect(page.locator("#loss-chart .no-data")).to_have_text("no data yet")
        expect(page.locator("#log")).to_contain_text("x" * 3000)
        no_sideways_scroll(page, "job page")
        inside = page.evaluate(
            "() => { const log = document.getElementById('log');"
            " return [log.scrollWidth, log.clientWidth]; }"
        )
        assert inside[0] <= inside[1], f"the log scrolls sideways: {inside}"
        page.get_by_label("Search").fill("loss")
        page.get_by_label("Search").press("Enter")
        expect(page.locator("#log")).to_have_text("step 1 loss 5.0\nstep 2 loss 4.0")
        with page.expect_download() as got:
            page.get_by_role("link", name="Download the whole log").click()
        assert Path(got.value.path()).read_text() == log.read_text()
        page.goto(f"{server.url}/#/cluster")
        expect(page.locator("#queue tbody tr")).to_have_count(1)
        no_sideways_scroll(page, "cluster page")
        api.cancel(job["id"])  # ended with nothing logged: the chart says so
        page.goto(f"{server.url}/#/jobs/{job['id']}")
        expect(page.locator("#job-state")).to_have_text("CANCELLED")
        expect(page.locator("#loss-chart .no-data")).to_have_text("nothing was logged")
        # A job that failed on a file deep in a folder: the path wraps, and the failures
        # are said as they ended (no budget left to spend beside "not retried").
        failed = api.submit(long_job("failed"))
        deep = "/srv/shardline/data/" + "/".join(["a_rather_long_folder_name"] * 12) + "/x.bin"
        fail_job(
            settings, failed["id"], f"data.path: {deep} is not a whole number of ids; not retried"
        )
        page.goto(f"{server.url}/#/jobs/{failed['id']}")
        expect(page.locator("#job-state")).to_have_text("FAILED")
        expect(page.locator("#job-summary")).to_contain_text("not retried")
        failures = page.locator("#job-summary dt", has_text="Failures").locator(
            "xpath=following-sibling::dd[1]"
        )
        expect(failures).to_have_text("1")
        no_sideways_scroll(page, "failed job page")
        # An ended job goes from its page, after a question.
        expect(page.get_by_role("button", name="Delete job")).to_be_visible()
        page.once("dialog", lambda dialog: dialog.accept())
        page.get_by_role("button", name="Delete job").click()
        expect(page).to_have_url(re.compile(r"#/$"))  # back to the list, once deleted
        with pytest.raises(NotFound):
            api.get(failed["id"])
        expect(page.locator("#jobs tbody tr")).to_have_count(1)  # the cancelled one
    assert sandboxed_page.outside == []


def fail_job(settings: Settings, job_id: str, reason: str) -> None:
    """The job as a deterministic failure leaves it: FAILED after one failure."""
    db = Database(settings.resolved_database_url)
    with db.session() as s:
        s.execute(
            update(Job)
            .where(Job.id == job_id)
            .values(state="FAILED", failures=1, failure_reason=reason)
        )
        s.commit()
    db.dispose()
