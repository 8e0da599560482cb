"""Real headless Chromium (the system package) driven by Playwright, with no way out.

Every page gets request routing that lets through only 127.0.0.1 and records anything
else, so a test can assert that a page made zero requests to other hosts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Request, Route, sync_playwright

CHROMIUM = os.environ.get("SHARDLINE_TEST_CHROMIUM", "/usr/bin/chromium")
LOCAL_HOSTS = {"127.0.0.1"}
DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


@pytest.fixture(scope="session")
def browser() -> Iterator[Browser]:
    if not (Path(CHROMIUM).is_file() or shutil.which(CHROMIUM)):
        # Fail, never skip: a missing browser must not turn the browser tier green.
        pytest.fail(
            f"Chromium not found at {CHROMIUM}: `apt-get install -y chromium` "
            "(or set SHARDLINE_TEST_CHROMIUM)"
        )
    with sync_playwright() as pw:
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
        )
        try:
            yield chromium
        finally:
            chromium.close()


@dataclass
class Sandboxed:
    page: Page
    outside: list[str] = field(default_factory=list)  # URLs that tried to leave the host
    # Non-local URLs the page's Content-Security-Policy stopped inside the browser, before
    # any network request was made.
    stopped_by_policy: list[str] = field(default_factory=list)


def open_sandboxed(browser: Browser, viewport: dict[str, int] = DESKTOP) -> Sandboxed:
    """A fresh browser context whose page can reach 127.0.0.1 and nothing else."""
    context = browser.new_context(viewport=viewport)  # type: ignore[arg-type]
    page = context.new_page()
    sandboxed = Sandboxed(page)

    def gate(route: Route) -> None:
        if stays_local(route.request.url):
            route.continue_()
        else:
            sandboxed.outside.append(route.request.url)
            route.abort("blockedbyclient")

    def watch(request: Request) -> None:
        # Requests the router does not see (e.g. websockets) are recorded here as well.
        if not stays_local(request.url) and request.url not in sandboxed.outside:
            sandboxed.outside.append(request.url)

    def failed(request: Request) -> None:
        # Chromium reports these as "csp"; the request never reached the network.
        if (
            request.failure in ("csp", "net::ERR_BLOCKED_BY_CSP")
            and request.url in sandboxed.outside
        ):
            sandboxed.outside.remove(request.url)
            sandboxed.stopped_by_policy.append(request.url)

    context.route("**/*", gate)
    page.on("request", watch)
    page.on("requestfailed", failed)
    return sandboxed


def stays_local(url: str) -> bool:
    parts = urlsplit(url)
    return parts.scheme in ("data", "blob") or parts.hostname in LOCAL_HOSTS


@pytest.fixture
def sandboxed_page(browser: Browser) -> Iterator[Sandboxed]:
    sandboxed = open_sandboxed(browser)
    yield sandboxed
    sandboxed.page.context.close()


@pytest.fixture(scope="session")
def screenshot_dir() -> Path:
    """Screenshots land under the test output folder (SHARDLINE_TEST_OUTPUT or test-output/)."""
    folder = Path(os.environ.get("SHARDLINE_TEST_OUTPUT", "test-output")) / "screenshots"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
