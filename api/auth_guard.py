"""The per-address limit on failed authentications, answered before anything else runs.

An address whose failed-authentication bucket is empty gets its 429 here, at the edge of
the ASGI stack: no routing, no dependency resolution, no telemetry, no token lookup. A
flood of bad tokens then costs the server as little as a request can, so `/healthz` and
everyone else's requests keep their latency. A request from such an address with a live
token goes on all the same (api/live_tokens.py): the address may be shared (every client
of a default bind, every client behind one proxy), and nobody is refused for someone
else's bad tokens. Requests that are not over the limit go on to `get_current_user`,
which counts their failures.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from shardline.api.live_tokens import LiveTokens
from shardline.api.rate_limit import TokenBuckets, retry_after_header
from shardline.service.users import hash_token

# Every route under these needs a token; /healthz, /readyz, the page and its assets do not.
GUARDED_PREFIXES = ("/v1/", "/metrics")


def refusal_message(address: str) -> str:
    return (
        f"too many requests with a missing or invalid token from {address}; retry after "
        "the Retry-After seconds (the server's limit is SHARDLINE_AUTH_FAILURES_PER_S "
        "and SHARDLINE_AUTH_FAILURES_BURST)"
    )


class FailedAuthGuard:
    def __init__(self, app: ASGIApp, failures: TokenBuckets, live: LiveTokens) -> None:
        self.app, self.failures, self.live = app, failures, live

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        wait_s = self.failures.wait(address)
        if wait_s <= 0 or await self._live_token(scope):
            await self.app(scope, receive, send)
            return
        body = json.dumps(
            {
                "error": {
                    "code": "rate_limited",
                    "message": refusal_message(address),
                    "details": None,
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 429,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"retry-after", retry_after_header(wait_s)["Retry-After"].encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    async def _live_token(self, scope: Scope) -> bool:
        """Whether the request carries a live bearer token."""
        for name, value in scope["headers"]:
            if name == b"authorization":
                scheme, _, token = value.decode("latin-1").partition(" ")
                return scheme.lower() == "bearer" and await self.live.holds(hash_token(token))
        return False
