"""The real API server (uvicorn on a free port) in a background thread."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx
import uvicorn
from fastapi import FastAPI

from shardline.api.app import create_app
from shardline.api.listening import server_config
from shardline.service.config import Settings
from shardline.service.runtime import Runtime
from shardline.workers.contract.net import free_port


@dataclass
class RunningServer:
    url: str
    settings: Settings
    app: FastAPI


@contextmanager
def run_server(
    settings: Settings, runtime: Runtime | None = None, port: int | None = None
) -> Iterator[RunningServer]:
    """Serve on `port` (a free one by default) until the block ends."""
    port = port or free_port()
    settings = settings.model_copy(update={"port": port})
    app = create_app(settings, runtime)
    server = uvicorn.Server(
        server_config(app, settings, host="127.0.0.1", port=port, lifespan="on")
    )
    thread = threading.Thread(target=server.run, name="uvicorn", daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    # Startup connects to Ray (lifespan); on a loaded 2-core machine that can take a while.
    deadline = time.monotonic() + 90
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the test server did not start")
        time.sleep(0.05)
    try:
        yield RunningServer(url, settings, app)
    finally:
        server.should_exit = True
        thread.join(timeout=30)
