"""The SDK's errors for a server that cannot be reached or does not answer: ShardlineError
subclasses naming the URL, never an httpx exception; and the SDK loads no control-plane
code."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from shardline.api.client import Client, ServerUnreachable, ShardlineError


def test_a_server_that_is_not_there_is_named() -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", "token", timeout=2) as client:
        with pytest.raises(ServerUnreachable) as caught:
            client.list()
        with pytest.raises(ServerUnreachable):  # a streamed read too
            list(client.follow_logs("abc", rank=0))
    assert isinstance(caught.value, ShardlineError) and caught.value.code == "unreachable"
    assert f"http://127.0.0.1:{port}" in caught.value.message


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


def test_a_server_that_does_not_answer_is_a_timeout(silent_server: str) -> None:
    with Client(silent_server, "token", timeout=0.5) as client:
        with pytest.raises(ServerUnreachable) as caught:
            client.get("abc")
        assert caught.value.code == "timeout" and silent_server in caught.value.message


def test_the_sdk_loads_no_control_plane_code() -> None:
    probe = (
        "import sys, shardline.api.client\n"
        "print(sorted(m for m in sys.modules if m.startswith(('shardline.service', 'torch'))))"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_sdk_s_defaults_are_the_server_s(monkeypatch: pytest.MonkeyPatch) -> None:
    from shardline.api.credentials import default_url, local_admin_token_file
    from shardline.service.config import Settings

    for name in (
        "SHARDLINE_HOST",
        "SHARDLINE_PORT",
        "SHARDLINE_STATE_DIR",
        "SHARDLINE_ADMIN_TOKEN_FILE",
    ):
        monkeypatch.delenv(name, raising=False)
    settings = Settings()
    assert default_url() == f"http://{settings.host}:{settings.port}"
    assert local_admin_token_file() == settings.resolved_admin_token_file
    monkeypatch.setenv("SHARDLINE_STATE_DIR", "/srv/state")
    monkeypatch.setenv("SHARDLINE_PORT", "9000")
    assert local_admin_token_file() == Settings().resolved_admin_token_file
    assert default_url().endswith(":9000")


def test_an_address_without_a_scheme_says_how_to_write_it() -> None:
    with Client("127.0.0.1:9", "token") as client, pytest.raises(ServerUnreachable) as caught:
        client.list()
    assert caught.value.code == "bad_url"
    assert "write it as http://127.0.0.1:9" in caught.value.message
