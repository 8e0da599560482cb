"""The read cache (one class, a real SQLite database for the commits that drop what it
keeps): fresh answers are given again, stale ones never."""

from __future__ import annotations

from pathlib import Path

from service.db import Database
from service.migrate import upgrade_to_head
from service.read_cache import ReadCache, commits
from service.users import UserDirectory
from tests.support.clock import Clock


def test_an_answer_is_given_again_until_its_time_is_up() -> None:
    clock = Clock()
    cache = ReadCache(1.0, clock=clock)
    cache.put("k", "answer", commits())
    clock.now = 0.99
    assert cache.get("k") == "answer"
    clock.now = 1.0
    assert cache.get("k") is None
    assert cache.get("never kept") is None


def test_a_commit_in_this_process_drops_every_answer_and_one_read_before_it(
    tmp_path: Path,
) -> None:
    url = f"sqlite:///{tmp_path / 'cache.db'}"
    upgrade_to_head(url)
    db = Database(url)
    users = UserDirectory(db)
    cache = ReadCache(60.0)
    try:
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
    finally:
        db.dispose()


def test_off_at_zero_and_bounded() -> None:
    off = ReadCache(0.0)
    off.put("k", 1, commits())
    assert not off.enabled and off.get("k") is None
    small = ReadCache(60.0, max_entries=2)
    for key in "abc":
        small.put(key, key, commits())
    assert small.get("c") == "c" and small.get("a") is None  # full: started again
