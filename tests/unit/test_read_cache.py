"""The read cache (one class, a real SQLite database for the commits that drop what it
keeps): fresh answers are given again, stale ones never."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine

from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.read_cache import SMALL_ENTRY_BYTES, ReadCache, commits, moved_on, size_of
from shardline.service.users import UserDirectory
from tests.support.clock import Clock


@pytest.fixture
def users(tmp_path: Path) -> Iterator[UserDirectory]:
    """A real SQLite database whose writes are the process's commits."""
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    upgrade_to_head(url)
    db = Database(url)
    try:
        yield UserDirectory(db)
    finally:
        db.dispose()


def test_an_answer_is_given_again_until_its_time_is_up() -> None:
    clock = Clock()
    cache = ReadCache(1.0, clock=clock)
    cache.put("k", "answer", commits())
    clock.now = 0.99
    assert cache.get("k") == "answer"
    clock.now = 1.0
    assert cache.get("k") is None
    assert cache.get("never kept") is None


def test_kept_longer_only_while_writes_are_heard_of() -> None:
    clock = Clock()
    cache = ReadCache(1.0, notified_ttl_s=10.0, clock=clock)
    cache.put("short", "answer", commits())  # nothing heard yet: read_cache_s
    clock.now = 1.0
    assert cache.get("short") is None
    cache.heard(sent_at=1.0)  # a listener's own notice, sent at 1.0, came back
    assert cache.listening
    cache.put("k", "answer", commits())
    for now in (1.5, 2.5, 5.0):  # heard of again and again: kept up to 10 s
        clock.now = now
        cache.heard(sent_at=now - 0.1)
        assert cache.get("k") == "answer"
    moved_on()  # a notice of another process's write
    assert cache.get("k") is None
    cache.put("k", "answer", commits())
    # Nothing heard after 5.0 (the listener stalled or cut off): past ttl_s since the
    # last notice was sent, what was kept longer than ttl_s is not given.
    clock.now = 5.8
    assert cache.get("k") == "answer"
    clock.now = 6.05
    assert not cache.listening
    assert cache.get("k") is None
    # Heard again (the listener moved the count on before it was): kept longer again.
    clock.now = 7.0
    cache.heard(sent_at=7.0)
    cache.put("k", "answer", commits())
    clock.now = 9.0
    cache.heard(sent_at=9.0)
    assert cache.get("k") == "answer"


def test_a_put_kept_for_less_drops_what_was_kept_for_longer() -> None:
    """Entries expire in the order they were kept, even when hearing stops."""
    clock = Clock()
    cache = ReadCache(1.0, notified_ttl_s=10.0, clock=clock)
    cache.heard(sent_at=0.0)
    cache.put("long", "answer", commits())
    clock.now = 1.0  # heard nothing since 0.0: read_cache_s again
    cache.put("short", "answer", commits())
    assert len(cache) == 1 and cache.get("short") == "answer"


def test_a_commit_in_this_process_drops_every_answer_and_one_read_before_it(
    users: UserDirectory,
) -> None:
    cache = ReadCache(60.0)
    before = commits()
    cache.put("kept", 1, before)
    # A read that began before a commit (of any Database of the process, any table)
    # and ended after it: its answer may be older than the commit, so it is not kept.
    users.ensure_user("someone")
    assert commits() > before
    assert cache.get("kept") is None
    cache.put("read across the commit", 2, before)
    assert cache.get("read across the commit") is None
    cache.put("read after", 3, commits())
    assert cache.get("read after") == 3
    # A read changes nothing.
    users.list_tokens()
    assert cache.get("read after") == 3


def test_off_at_zero_and_bounded_in_entries_oldest_first() -> None:
    off = ReadCache(0.0)
    off.put("k", 1, commits())
    assert not off.enabled and off.get("k") is None
    small = ReadCache(60.0, max_entries=2)
    for key in "abc":
        small.put(key, key, commits())
    assert small.get("a") is None and small.get("b") == "b" and small.get("c") == "c"
    four = ReadCache(60.0, max_entries=4)
    for key in "abc":
        four.put(key, key, commits())
    four.put("a", "a again", commits())  # kept again: now the newest
    for key in "de":
        four.put(key, key, commits())
    assert four.get("b") is None and four.get("a") == "a again" and len(four) == 4


def test_bounded_in_bytes_and_an_answer_over_the_bound_is_not_kept() -> None:
    cache = ReadCache(60.0, max_bytes=3 * (1000 + SMALL_ENTRY_BYTES))
    for page in range(5):  # distinct cursors of a listing, 1000 bytes each
        cache.put(("page", page), (7, b"x" * 1000), commits())
    assert len(cache) == 3 and cache.held_bytes <= cache.max_bytes
    assert cache.get(("page", 1)) is None and cache.get(("page", 4)) is not None
    cache.put("huge", b"x" * cache.max_bytes, commits())
    assert cache.get("huge") is None and len(cache) == 3
    cache.put(("page", 4), (7, b"y" * 10), commits())  # kept again, smaller
    kept = [cache.get(("page", p)) for p in range(5)]
    assert cache.held_bytes == sum(size_of(v) for v in kept if v is not None)


def test_expired_answers_are_dropped_by_the_next_put_not_only_when_read_again() -> None:
    clock = Clock()
    cache = ReadCache(1.0, clock=clock)
    for page in range(100):
        cache.put(("page", page), b"x" * 1000, commits())
    clock.now = 0.5
    cache.put("young", b"y", commits())
    assert len(cache) == 101
    clock.now = 1.2  # the pages expired, "young" has not
    cache.put("newest", b"z", commits())
    assert len(cache) == 2 and cache.get("young") == b"y"
    assert cache.held_bytes == size_of(b"y") + size_of(b"z")


def test_a_put_after_a_commit_frees_what_the_commit_made_stale(users: UserDirectory) -> None:
    cache = ReadCache(60.0)
    for page in range(10):
        cache.put(("page", page), b"x" * 1000, commits())
    users.ensure_user("someone")
    cache.put("after", b"a", commits())
    assert len(cache) == 1 and cache.held_bytes == size_of(b"a")


def test_a_put_read_before_a_commit_leaves_what_was_kept_after_it(
    users: UserDirectory,
) -> None:
    cache = ReadCache(60.0)
    before = commits()
    users.ensure_user("someone")
    cache.put("read after", 1, commits())
    cache.put("read before, put late", 2, before)
    assert cache.get("read after") == 1 and len(cache) == 1


def test_a_read_taken_while_a_commit_lands_is_not_kept(
    users: UserDirectory, tmp_path: Path
) -> None:
    """The count moves when a commit begins and again once it has landed: a read that
    starts in between (it counts the first move, but sees the data before the commit) is
    dropped at the second, so a stale answer is never given."""
    from sqlalchemy import event, text
    from sqlalchemy.engine import Connection

    cache = ReadCache(60.0)
    db = Database(f"sqlite:///{tmp_path / 'cache.db'}")  # the same file, another engine
    seen: list[int] = []

    def read_while_committing(conn: Connection) -> None:
        # The writer's commit has begun (its Core event) but not landed: another
        # connection reads the count of users as it was, under the moved count.
        if not seen:
            generation = commits()
            with db.reader(gated=False) as reader:
                seen.append(reader.execute(text("SELECT count(*) FROM users")).scalar_one())
            cache.put("users", seen[0], generation)

    event.listen(Engine, "commit", read_while_committing)
    try:
        users.ensure_user("someone new")
    finally:
        event.remove(Engine, "commit", read_while_committing)
        db.dispose()
    with users.db.reader(gated=False) as reader:
        now = reader.execute(text("SELECT count(*) FROM users")).scalar_one()
    assert seen and now == seen[0] + 1  # the read saw the users before the commit
    assert cache.get("users") is None
