"""Interactive API docs (/docs) from assets shipped in the package.

FastAPI's own docs page loads Swagger UI from public CDNs, a blank page on an air-gapped
cluster. The `fastapi-offline` package bundles the same assets (MIT); we serve them from
its package folder and build the page with FastAPI's own HTML helper. ReDoc is not
offered: it refuses the job spec's inline `$defs` schema, which Swagger UI renders.
"""

from __future__ import annotations

from pathlib import Path

import fastapi_offline
from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from starlette.responses import HTMLResponse

from api.static_files import PAGE_CACHE_CONTROL, CachedStaticFiles

ASSETS_URL = "/static/docs"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"

# validatorUrl: Swagger UI would otherwise send the spec to validator.swagger.io.
_SWAGGER_PARAMETERS = {"validatorUrl": None, "persistAuthorization": False}


def install_docs(app: FastAPI) -> None:
    """Add /docs to an app built with docs_url=None and redoc_url=None."""
    app.mount(ASSETS_URL, CachedStaticFiles(directory=ASSETS_DIR), name="docs-assets")
    title = app.title
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        page = get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{title} API",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=_SWAGGER_PARAMETERS,
        )
        page.headers["Cache-Control"] = PAGE_CACHE_CONTROL
        return page
