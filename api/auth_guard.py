"""The per-address limit on failed authentications, answered before anything else runs.

An address whose failed-authentication bucket is empty gets its 429 here, at the edge of
the ASGI stack: no routing, no dependency resolution, no telemetry, no token lookup. A
flood of bad tokens then costs the server as little as a request can, so `/healthz` and
everyone else's requests keep their latency (S3 item 7). Requests that are not yet over
the limit go on to `get_current_user`, which counts their failures.
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

from shardline.api.rate_limit import TokenBuckets, retry_after_header

# Every route under these needs a token; /healthz, /readyz, the page and its assets do not.
GUARDED_PREFIXES = ("/v1/", "/metrics")


def refusal_message(address: str) -> str:
    return (
        f"too many requests with a missing or invalid token from {address}; retry after "
        "the Retry-After seconds (the server's limit is SHARDLINE_AUTH_FAILURES_PER_S "
        "and SHARDLINE_AUTH_FAILURES_BURST)"
    )


class FailedAuthGuard:
    def __init__(self, app: ASGIApp, failures: TokenBuckets) -> None:
        self.app, self.failures = app, failures

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(GUARDED_PREFIXES):
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        address = client[0] if client else "unknown"
        wait_s = self.failures.wait(address)
        if wait_s <= 0:
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
