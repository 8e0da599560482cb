"""The status page in real Chromium against a real server, database and Ray cluster."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Browser, Page, expect

from shardline.api.client import Client
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.local_ray import LocalRay
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory
from shardline.workers.contract.net import free_port
from tests.browser.conftest import DESKTOP, PHONE, Sandboxed, open_sandboxed
from tests.e2e.conftest import Service, service  # noqa: F401  (fixture)
from tests.support.ray_head import running_ray_head
from tests.support.server import run_server

PAGE_SIZE = 25  # the page's (list.js)

ServiceFactory = Callable[..., AbstractContextManager[Service]]


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRay]:
    """This module's own head, stopped after it: the e2e tier's lives for the session."""
    with running_ray_head(tmp_path_factory.mktemp("ray-state")) as head:
        yield head


def long_job(name: str) -> dict[str, Any]:
    """Runs far longer than the test looks at it; the test cancels it."""
    return {
        "name": name,
        "model": {"preset": "tiny", "seq_len": 32},
        "train": {
            "steps": 100_000,
            "global_batch_size": 2,
            "micro_batch_size": 1,
            "log_every": 2,
            "eval_every": 20,
        },
    }


def sign_in(page: Page, url: str, token: str) -> None:
    page.goto(url + "/")
    page.get_by_label("API token").fill(token)
    page.get_by_label("API token").press("Enter")  # the keyboard alone signs in


def step_of(page: Page, job_id: str) -> int:
    text = page.locator(f'tr[data-job-id="{job_id}"] td.step').inner_text()
    return int(text.split("/")[0])


def points(page: Page) -> int:
    return int(page.locator("#loss-chart").get_attribute("data-points") or 0)


def shoot(page: Page, folder: Path, name: str) -> None:
    """Screenshots at desktop and phone width; at phone width nothing may scroll sideways."""
    for label, viewport in (("desktop", DESKTOP), ("phone", PHONE)):
        page.set_viewport_size(viewport)  # type: ignore[arg-type]
        # Charts take the new width on the next frames (a ResizeObserver): wait for them.
        page.evaluate("() => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 50)))")
        page.screenshot(path=str(folder / f"{name}-{label}.png"), full_page=True)
        wide, screen = page.evaluate(
            "() => [document.documentElement.scrollWidth, window.innerWidth]"
        )
        assert wide <= screen, f"{name}: {wide} px wide in a {screen} px screen"
    page.set_viewport_size(DESKTOP)  # type: ignore[arg-type]


def test_running_job_updates_live_and_cancels_from_its_page(
    service: ServiceFactory,  # noqa: F811
    sandboxed_page: Sandboxed,
    screenshot_dir: Path,
) -> None:
    page = sandboxed_page.page
    with service() as svc, svc.running() as server, svc.client(server) as api:
        job = api.submit(long_job("browser-live"))
        sign_in(page, server.url, svc.token)
        row = page.locator(f'tr[data-job-id="{job["id"]}"]')
        expect(row).to_contain_text("browser-live")
        expect(row.locator("span.state")).to_have_text("RUNNING", timeout=120_000)
        expect(row.locator("td.step")).not_to_have_text(re.compile(r"^0/"), timeout=60_000)
        first = step_of(page, job["id"])
        page.wait_for_function(
            f"""() => {{
                const cell = document.querySelector('tr[data-job-id="{job["id"]}"] td.step');
                return parseInt(cell.textContent) > {first};
            }}""",
            timeout=30_000,
        )  # the step moved on with no reload
        assert step_of(page, job["id"]) > first
        shoot(page, screenshot_dir, "job-list")

        row.get_by_role("link", name="browser-live").click()
        expect(page.locator("#job-state")).to_have_text("RUNNING")
        page.wait_for_function("() => +document.querySelector('#loss-chart').dataset.points > 0")
        seen = points(page)
        page.wait_for_function(
            f"() => +document.querySelector('#loss-chart').dataset.points > {seen}",
            timeout=30_000,
        )  # the chart gained points from metrics?since_step=
        expect(page.locator("#timeline")).to_contain_text("STARTING → RUNNING")
        expect(page.locator("#log")).to_contain_text("loss", timeout=30_000)
        expect(page.locator("#pause")).to_be_visible()  # RUNNING: pause applies
        expect(page.locator("#resume")).to_be_hidden()
        shoot(page, screenshot_dir, "job-page")
        hover_and_zoom(page)

        # A profile of the next 2 steps, taken from the page, downloads as a Chrome trace.
        page.get_by_label("Profile the next").fill("2")
        page.get_by_role("button", name="Profile", exact=True).click()
        link = page.get_by_role("link", name="Download the trace")
        expect(link).to_be_visible(timeout=60_000)
        with page.expect_download() as got:
            link.click()
        trace = json.loads(Path(got.value.path()).read_text())
        ranks = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
        assert ranks == {"rank 0"}
        steps = {e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep")}
        assert len(steps) == 2, steps

        # A fault, a pause and a resume are marked on the curve, each with its step.
        with admin_client(svc, server.url) as admin:
            admin.inject_fault(job["id"], "kill", 0)
        marks = page.locator("#marks")
        expect(marks).to_contain_text("restart near step", timeout=120_000)
        expect(marks).to_contain_text("(kill on rank 0)")
        expect(page.locator("#pause")).to_be_visible(timeout=60_000)
        page.locator("#pause").click()
        expect(page.locator("#job-state")).to_have_text("PAUSED", timeout=120_000)
        expect(marks).to_contain_text("paused at step")
        page.locator("#resume").click()
        expect(page.locator("#job-state")).to_have_text("RUNNING", timeout=120_000)
        paused_at = points(page)
        page.wait_for_function(
            f"() => +document.querySelector('#loss-chart').dataset.points > {paused_at}",
            timeout=60_000,
        )  # it trains on after the resume
        assert int(page.locator("#loss-chart").get_attribute("data-markers") or 0) >= 3
        shoot(page, screenshot_dir, "job-page-marked")

        # The cluster page names the node the job's one rank holds, linked to the job.
        page.get_by_role("link", name="Cluster").click()
        holding = page.locator("#nodes ul.held li", has_text="browser-live")
        expect(holding).to_contain_text("1 rank, 1 CPU")
        shoot(page, screenshot_dir, "cluster-page")
        holding.get_by_role("link", name="browser-live").click()
        expect(page.locator("#job-state")).to_have_text("RUNNING")

        page.once("dialog", lambda dialog: dialog.accept())
        page.locator("#cancel").click()
        expect(page.locator("#job-state")).to_have_text("CANCELLED", timeout=120_000)
        expect(page.locator("#cancel")).to_be_hidden()
        # A finished job's charts show its data, never "no data yet".
        expect(page.locator("#loss-chart .no-data")).to_be_hidden()
        expect(page.locator("#loss-chart canvas")).to_be_visible()
        assert api.get(job["id"])["state"] == "CANCELLED"
        # A finished job is not polled any more.
        polls: list[str] = []
        page.on("request", lambda r: polls.append(r.url) if "/v1/jobs/" in r.url else None)
        page.wait_for_timeout(5_000)
        assert polls == []
    assert sandboxed_page.outside == []


def admin_client(svc: Service, url: str) -> Client:
    db = Database(svc.database_url)
    try:
        users = UserDirectory(db)
        token = users.issue_token(users.ensure_user("browser-admin", admin=True), "test").token
    finally:
        db.dispose()
    return Client(url, token)


def steps_shown(page: Page) -> tuple[float, float]:
    low, high = (page.locator("#loss-chart").get_attribute("data-steps") or "0-0").split("-")
    return float(low), float(high)


def hover_and_zoom(page: Page) -> None:
    """Hovering the loss chart shows the loss at that step; dragging across it zooms in,
    and a double-click zooms out again."""
    plot = page.locator("#loss-chart .u-over")
    box = plot.bounding_box()
    assert box is not None
    plot.hover(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    train = page.locator("#loss-chart .u-legend .u-series").nth(1).locator(".u-value")
    expect(train).to_have_text(re.compile(r"^\d+(\.\d+)?$"))
    low, high = steps_shown(page)
    page.mouse.move(box["x"] + box["width"] * 0.2, box["y"] + box["height"] * 0.5)
    page.mouse.down()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.5, steps=5)
    page.mouse.up()
    zoomed_low, zoomed_high = steps_shown(page)
    assert zoomed_high - zoomed_low < 0.5 * (high - low), (low, high, zoomed_low, zoomed_high)
    plot.dblclick(position={"x": box["width"] * 0.5, "y": box["height"] * 0.5})
    out_low, out_high = steps_shown(page)
    assert out_high - out_low >= high - low, (low, high, out_low, out_high)


@pytest.fixture
def plain_server_settings(tmp_path: Path) -> Iterator[tuple[Settings, str]]:
    url = f"sqlite:///{tmp_path / 'shardline.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    token = users.issue_token(users.ensure_user("viewer"), "browser").token
    db.dispose()
    yield Settings(database_url=url, state_dir=tmp_path / "state"), token


def test_wrong_token_shows_rejection(
    plain_server_settings: tuple[Settings, str], sandboxed_page: Sandboxed
) -> None:
    settings, token = plain_server_settings
    page = sandboxed_page.page
    with run_server(settings) as server:
        sign_in(page, server.url, token + "-wrong")
        expect(page.locator("#login-rejected")).to_be_visible()
        expect(page.locator("#jobs-view")).to_be_hidden()
        sign_in(page, server.url, token)
        expect(page.locator("#no-jobs")).to_be_visible()
        assert "token" not in page.url
        page.get_by_role("button", name="Log out").click()
        expect(page.get_by_label("API token")).to_be_visible()
        assert page.evaluate("localStorage.getItem('shardline-token')") is None


def test_unreachable_server_is_shown_and_the_page_recovers(
    plain_server_settings: tuple[Settings, str], browser: Browser
) -> None:
    settings, token = plain_server_settings
    sandboxed = open_sandboxed(browser)
    page = sandboxed.page
    port = free_port()
    try:
        with run_server(settings, port=port) as server:
            sign_in(page, server.url, token)
            expect(page.locator("#no-jobs")).to_be_visible()
        expect(page.locator("#offline")).to_be_visible(timeout=15_000)
        time.sleep(3)  # it keeps retrying while the server is down
        expect(page.locator("#offline")).to_be_visible()
        with run_server(settings, port=port):
            expect(page.locator("#offline")).to_be_hidden(timeout=15_000)
            expect(page.locator("#no-jobs")).to_be_visible()
    finally:
        page.context.close()


def test_list_pages_filters_and_shows_newest_first(
    plain_server_settings: tuple[Settings, str], sandboxed_page: Sandboxed
) -> None:
    settings, token = plain_server_settings
    page = sandboxed_page.page
    with run_server(settings) as server, Client(server.url, token) as api:
        # No runtime: the jobs stay QUEUED, except those cancelled here.
        ids = [api.submit(long_job(f"list-{i:02d}"))["id"] for i in range(PAGE_SIZE + 3)]
        for job_id in ids[:2]:
            api.cancel(job_id)
        sign_in(page, server.url, token)
        names = page.locator("#jobs tbody td.name")
        expect(names).to_have_count(PAGE_SIZE)
        expect(names.first).to_have_text(f"list-{PAGE_SIZE + 2:02d}")  # newest first
        page.get_by_role("button", name="Next page").click()
        expect(names).to_have_text(["list-02", "list-01", "list-00"])
        page.get_by_role("button", name="First page").click()
        expect(names).to_have_count(PAGE_SIZE)
        page.get_by_label("State").select_option("CANCELLED")
        expect(names).to_have_text(["list-01", "list-00"])
        page.get_by_label("State").select_option("RUNNING")
        expect(page.locator("#no-matches")).to_have_text("No RUNNING jobs.")
        expect(page.locator("#no-jobs")).to_be_hidden()
