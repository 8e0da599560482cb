"""The write listener alone, over a scripted connection (the real database's notices are
tested through a server in tests/api/test_read_cache.py): what moves the read cache's
count on, what tells it writes are heard of, and a database without the triggers."""

from __future__ import annotations

from collections import deque
from types import TracebackType
from typing import Any

import pytest

from shardline.service.read_cache import ReadCache, commits
from shardline.service.write_notices import CHANNEL, PING, TRIGGERS, NotHeard, WriteListener
from tests.support.clock import Clock


class Notice:
    def __init__(self, payload: str) -> None:
        self.channel, self.payload = CHANNEL, payload


class ScriptedConnection:
    """Answers the listener's statements; each `notifies()` gives the next batch of
    notices, where "OWN" stands for the listener's own ping; the script's end stops it."""

    def __init__(self, listener: WriteListener, batches: list[list[str]], triggers: int) -> None:
        self.listener = listener
        self.batches = deque(batches)
        self.triggers = triggers
        self.ping = ""
        self.count_at_listen: int | None = None
        self.heard_at_listen: bool | None = None

    def __enter__(self) -> ScriptedConnection:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        return None

    def execute(self, statement: str, params: tuple[Any, ...] = ()) -> ScriptedConnection:
        if statement.startswith("LISTEN"):
            self.count_at_listen = commits()
            self.heard_at_listen = self.listener.cache.listening
        elif "pg_notify" in statement:
            self.ping = params[1]
        self.rows = [(name,) for name in TRIGGERS[: self.triggers]]
        return self

    def fetchall(self) -> list[tuple[str]]:
        return self.rows

    def notifies(self, timeout: float) -> list[Notice]:
        if not self.batches:
            self.listener._stop.set()
            return []
        return [Notice(self.ping if p == "OWN" else p) for p in self.batches.popleft()]


def listening(
    batches: list[list[str]], triggers: int = len(TRIGGERS)
) -> tuple[WriteListener, ScriptedConnection]:
    """A listener whose every connection is one scripted connection."""
    cache = ReadCache(1.0, notified_ttl_s=10.0, clock=Clock())
    listener = WriteListener("postgresql+psycopg://db/x", cache)
    conn = ScriptedConnection(listener, batches, triggers)
    listener.connect = lambda _: conn
    return listener, conn


def test_writes_move_the_count_on_and_its_own_notice_says_they_are_heard() -> None:
    listener, conn = listening([["", ""], ["OWN"], [f"{PING}another-server"], [""]])
    before = commits()
    listener.listen()
    assert conn.count_at_listen == before and conn.heard_at_listen is False
    # One for what was written before LISTEN, two writes, none for any ping, one write.
    assert commits() == before + 4
    assert listener.cache.listening  # its own notice came back


def test_nothing_is_heard_before_its_own_notice_comes_back() -> None:
    listener, _ = listening([[""], [f"{PING}another-server"]])
    before = commits()
    listener.listen()
    assert commits() == before + 2
    assert not listener.cache.listening


def test_a_database_without_the_triggers_is_never_heard() -> None:
    listener, _ = listening([["OWN"]], triggers=2)
    before = commits()
    with pytest.raises(NotHeard, match="shardline migrate"):
        listener.listen()
    assert commits() == before
    assert not listener.cache.listening
