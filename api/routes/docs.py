"""Interactive API docs (/docs, /redoc) from assets shipped in the package.

FastAPI's own docs pages load Swagger UI and ReDoc from public CDNs, a blank page on an
air-gapped cluster. The `fastapi-offline` package bundles the same assets (MIT); we serve
them from its package folder and build the pages with FastAPI's own HTML helpers.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from starlette.responses import HTMLResponse

from shardline.api.static_files import PAGE_CACHE_CONTROL, CachedStaticFiles

ASSETS_URL = "/static/docs"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"

# validatorUrl: Swagger UI would otherwise send the spec to validator.swagger.io.
_SWAGGER_PARAMETERS = {"validatorUrl": None, "persistAuthorization": False}
# This host only. ReDoc's sidebar always shows Redocly's logo from their CDN; under this
# policy the browser never requests it (the image hides itself when it fails). The
# pages' own inline script and styles come from FastAPI's HTML helpers.
DOCS_CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; connect-src 'self'; object-src 'none'; "
    "base-uri 'none'; frame-ancestors 'none'"
)


def _local_only(page: HTMLResponse) -> HTMLResponse:
    page.headers["Cache-Control"] = PAGE_CACHE_CONTROL
    page.headers["Content-Security-Policy"] = DOCS_CSP
    return page


def install_docs(app: FastAPI) -> None:
    """Add /docs and /redoc to an app built with docs_url=None and redoc_url=None."""
    app.mount(ASSETS_URL, CachedStaticFiles(directory=ASSETS_DIR), name="docs-assets")
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return _local_only(
            get_swagger_ui_html(
                openapi_url=openapi_url,
                title=f"{title} API",
                swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
                swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
                swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
                swagger_ui_parameters=_SWAGGER_PARAMETERS,
            )
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc() -> HTMLResponse:
        return _local_only(
            get_redoc_html(
                openapi_url=openapi_url,
                title=f"{title} API",
                redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
                redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
                with_google_fonts=False,  # fonts.googleapis.com otherwise
            )
        )
