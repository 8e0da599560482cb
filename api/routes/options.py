"""OPTIONS on any path: the methods every route of that path allows.

Starlette answers a method a path does not take from the first route of that path alone,
so OPTIONS /v1/jobs said `Allow: POST` although GET is served too. This route, added last,
answers OPTIONS for every path from all of its routes.
"""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.routing import Match, Mount

from api.errors import ApiError

router = APIRouter()


# The methods a route of this API may take; each is tried against the path.
_METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")


@router.options("/{path:path}", include_in_schema=False, status_code=204)
async def allowed_methods(request: Request, path: str) -> Response:
    methods: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Mount):  # static files
            if route.matches(request.scope)[0] != Match.NONE:
                methods |= {"GET", "HEAD"}
            continue
        for method in _METHODS:
            if route.matches({**request.scope, "method": method})[0] == Match.FULL:
                methods.add(method)
    if not methods:
        raise ApiError(404, "not_found", f"no route at /{path}")
    allow = ", ".join(sorted(methods | {"OPTIONS"}))
    return Response(status_code=204, headers={"Allow": allow})
