"""A failure that repeats (the database down for a while) is said once when it begins,
once a minute while it goes on and once when it ends, not a line or a traceback for every
request and every tick of the control plane's loops."""

from __future__ import annotations

import logging
import sqlite3
import threading

import pytest
from sqlalchemy import exc as db_errors

from shardline.service.loop import PeriodicLoop
from shardline.service.outages import SAY_AGAIN_S, OutageLog
from tests.support.clock import Clock


def database_down() -> db_errors.OperationalError:
    return db_errors.OperationalError(
        "SELECT 1", {}, sqlite3.OperationalError("database is locked")
    )


class Failing(PeriodicLoop):
    """Fails `times` ticks with `error()`, then ticks fine."""

    name = "flaky"

    def __init__(self, times: int, error: type[Exception] | None = None) -> None:
        super().__init__(interval_s=0.001)
        self.left, self.error, self.ticks = times, error, 0
        self.done = threading.Event()

    def tick(self) -> None:
        self.ticks += 1
        if self.left > 0:
            self.left -= 1
            raise database_down() if self.error is None else self.error("a bug")
        if self.ticks > 5 + 200:
            self.done.set()


def run(loop: Failing) -> None:
    loop.start()
    assert loop.done.wait(30)
    loop.stop()


def test_a_database_down_for_200_ticks_is_said_twice(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shardline.service")
    run(Failing(200))
    said = [r for r in caplog.records if r.name == "shardline.service.loop"]
    assert [r.levelno for r in said] == [logging.WARNING] * 2, [r.getMessage() for r in said]
    assert "the database does not answer" in said[0].getMessage()
    assert "database is locked" in said[0].getMessage() and not said[0].exc_info
    assert "no more: 200 failures" in said[1].getMessage()


def test_a_bug_that_repeats_is_one_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="shardline.service")
    run(Failing(50, KeyError))
    said = [r for r in caplog.records if r.name == "shardline.service.loop"]
    assert len(said) == 2, [r.getMessage() for r in said]
    assert "flaky tick failed" in said[0].getMessage() and said[0].exc_info
    assert "no more: 50 failures" in said[1].getMessage()


def test_a_long_outage_is_said_again_once_a_minute(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    outage = OutageLog(
        logging.getLogger("shardline.test"), "the database does not answer", clock=clock
    )
    caplog.set_level(logging.INFO, logger="shardline.test")
    for i in range(int(3 * SAY_AGAIN_S) * 8):  # three minutes, eight failures a second
        clock.now = i / 8
        outage.failed("connection refused")
    outage.recovered()
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 + 2 + 1, said  # at 0 s, 60 s, 120 s and its end
    assert said[1].startswith("the database does not answer still: 481 failures over 60 s")
    assert said[-1] == "the database does not answer no more: 1440 failures over 180 s"
