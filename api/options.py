"""OPTIONS on any path: the methods every route of that path allows.

Starlette answers a method a path does not take from the first route of that path alone,
so OPTIONS /v1/jobs said `Allow: POST` although GET is served too. This middleware answers
OPTIONS for every path from all of its routes (a route would match every path and turn
each unknown path's 404 into a 405).

It is pure ASGI: Starlette's `app.middleware("http")` runs every request, OPTIONS or not,
through an extra task and a streamed body, which cost more server CPU than a whole
/healthz answer.
"""

from __future__ import annotations

from fastapi import FastAPI, Response
from starlette.routing import Match, Mount
from starlette.types import ASGIApp, Receive, Scope, Send

from shardline.api.errors import error_response

# The methods a route of this API may take; each is tried against the path.
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


class AllowedMethods:
    def __init__(self, app: ASGIApp, api: FastAPI) -> None:
        self.app, self.api = app, api

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "OPTIONS":
            await self.app(scope, receive, send)
            return
        methods: set[str] = set()
        for route in self.api.router.routes:
            if isinstance(route, Mount):  # static files
                if route.matches(scope)[0] != Match.NONE:
                    methods |= {"GET", "HEAD"}
                continue
            for method in _METHODS:
                if route.matches({**scope, "method": method})[0] == Match.FULL:
                    methods.add(method)
        answer: Response
        if not methods:
            answer = error_response(404, "not_found", f"no route at {scope['path']}")
        else:
            allow = ", ".join(sorted(methods | {"OPTIONS"}))
            answer = Response(status_code=204, headers={"Allow": allow})
        await answer(scope, receive, send)


def install_options(app: FastAPI) -> None:
    app.add_middleware(AllowedMethods, api=app)
