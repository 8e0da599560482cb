"""The web status page: one HTML file and its scripts, shipped in the package.

No build step and nothing from elsewhere: the page is plain ES modules, and its charts
use uPlot, vendored beside them (uplot.iife.min.js, with its licence in uplot.LICENSE).
Its Content-Security-Policy allows this host only, so a stray external reference fails
loudly in the browser instead of leaking a request.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse

from shardline.api.static_files import PAGE_CACHE_CONTROL, CachedStaticFiles

PAGE_DIR = Path(__file__).resolve().parents[1] / "static" / "page"
PAGE_CSP = (
    "default-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)


def install_status_page(app: FastAPI) -> None:
    """Serve the status page at / and its files under /static/page."""
    app.mount("/static/page", CachedStaticFiles(directory=PAGE_DIR), name="page-assets")

    # HEAD too: uptime checks and load balancers probe the root with it.
    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)
    def status_page() -> FileResponse:
        return FileResponse(
            PAGE_DIR / "index.html",
            media_type="text/html; charset=utf-8",
            headers={"Cache-Control": PAGE_CACHE_CONTROL, "Content-Security-Policy": PAGE_CSP},
        )
