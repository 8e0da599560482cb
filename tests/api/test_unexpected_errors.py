"""An unexpected error is answered with the 500 error shape and logged exactly once."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx

from shardline.service.config import Settings
from tests.support.server import run_server


class Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def test_a_500_is_logged_once_with_its_traceback(tmp_path: Path) -> None:
    # A database nobody migrated: every authenticated request fails in the token lookup.
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'empty.db'}", state_dir=tmp_path)
    handler = Records()
    # uvicorn's loggers do not propagate to the root, and uvicorn configures them when it
    # starts: listen on them directly, once the server runs.
    loggers = [logging.getLogger(name) for name in ("shardline.api", "uvicorn.error", "uvicorn")]
    with run_server(settings) as server:
        for logger in loggers:
            logger.addHandler(handler)
        try:
            response = httpx.get(f"{server.url}/v1/jobs", headers={"Authorization": "Bearer x"})
        finally:
            for logger in loggers:
                logger.removeHandler(handler)
    assert response.status_code == 500
    assert response.json()["error"]["code"] == "internal_error"
    tracebacks = [r for r in handler.records if r.exc_info]
    assert len(tracebacks) == 1, [r.getMessage() for r in tracebacks]
    assert "GET /v1/jobs" in tracebacks[0].getMessage()
