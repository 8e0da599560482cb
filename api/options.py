"""OPTIONS on any path: the methods every route of that path allows.

Starlette answers a method a path does not take from the first route of that path alone,
so OPTIONS /v1/jobs said `Allow: POST` although GET is served too. This middleware answers
OPTIONS for every path from all of its routes (a route would match every path and turn
each unknown path's 404 into a 405).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from fastapi import FastAPI, Request, Response
from starlette.routing import Match, Mount

from api.errors import error_response

# The methods a route of this API may take; each is tried against the path.
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


def install_options(app: FastAPI) -> None:
    @app.middleware("http")
    async def allowed_methods(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if request.method != "OPTIONS":
            return await call_next(request)
        methods: set[str] = set()
        for route in app.router.routes:
            if isinstance(route, Mount):  # static files
                if route.matches(request.scope)[0] != Match.NONE:
                    methods |= {"GET", "HEAD"}
                continue
            for method in _METHODS:
                if route.matches({**request.scope, "method": method})[0] == Match.FULL:
                    methods.add(method)
        if not methods:
            return error_response(404, "not_found", f"no route at {request.url.path}")
        allow = ", ".join(sorted(methods | {"OPTIONS"}))
        return Response(status_code=204, headers={"Allow": allow})
