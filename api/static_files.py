"""Static files shipped in the package, served with cache headers.

Assets are revalidated hourly (ETag / Last-Modified come from StaticFiles), so an upgrade
shows up within the hour without versioned file names; nothing is fetched from elsewhere.
"""

from __future__ import annotations

from starlette.responses import Response
from starlette.staticfiles import StaticFiles
from starlette.types import Scope

ASSET_CACHE_CONTROL = "public, max-age=3600"
# HTML pages name the assets; they are always revalidated so they never go stale.
PAGE_CACHE_CONTROL = "no-cache"


class CachedStaticFiles(StaticFiles):
    """StaticFiles that tells browsers how long they may keep what it serves."""

    async def get_response(self, path: str, scope: Scope) -> Response:
        response = await super().get_response(path, scope)
        if response.status_code in (200, 304):
            response.headers["Cache-Control"] = ASSET_CACHE_CONTROL
        response.headers["X-Content-Type-Options"] = "nosniff"
        return response
