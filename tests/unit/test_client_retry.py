"""The SDK sends a read once more when its kept-alive connection was closed under it, and
never a write (which may have reached the server)."""

from __future__ import annotations

import httpx
import pytest

from shardline.api.client import Client, ServerUnreachable


def _flaky(fail: set[str]) -> tuple[httpx.MockTransport, list[str]]:
    sent: list[str] = []

    def handle(request: httpx.Request) -> httpx.Response:
        sent.append(request.method)
        if request.method in fail:
            fail.discard(request.method)
            raise httpx.ReadError("[Errno 104] Connection reset by peer", request=request)
        return httpx.Response(200, json={"id": "j1", "state": "RUNNING"})

    return httpx.MockTransport(handle), sent


def test_a_read_on_a_connection_closed_under_it_is_sent_again() -> None:
    transport, sent = _flaky({"GET"})
    with Client("http://api", "token", transport=transport) as c:
        assert c.get("j1")["state"] == "RUNNING"
    assert sent == ["GET", "GET"]


def test_a_write_is_never_sent_twice() -> None:
    transport, sent = _flaky({"POST"})
    with (
        Client("http://api", "token", transport=transport) as c,
        pytest.raises(ServerUnreachable) as caught,
    ):
        c.cancel("j1")
    assert sent == ["POST"]
    assert caught.value.code == "connection_lost" and "POST /v1/jobs/j1" in caught.value.message
    assert isinstance(caught.value.__cause__, httpx.ReadError)
