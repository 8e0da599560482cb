"""Following a log that another process appends to: whole lines only, none twice."""

from __future__ import annotations

from pathlib import Path

from service.job_logs import LogFollower


def test_starts_at_the_tail_then_returns_only_new_complete_lines(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("one\ntwo\nthree\npart")
    follower = LogFollower(log)
    assert follower.start(tail=2) == ["two", "three"]
    assert follower.read() == []  # "part" has no newline yet
    with log.open("a") as f:
        f.write("ial\nfour\n")
    assert follower.read() == ["partial", "four"]
    assert follower.read() == []


def test_a_log_that_appears_later_is_read_from_its_start(tmp_path: Path) -> None:
    log = tmp_path / "rank-1.log"
    follower = LogFollower(log)
    assert follower.start(tail=10) == []
    log.write_text("first\nsecond\n")
    assert follower.read() == ["first", "second"]


def test_rest_returns_a_last_line_without_newline_and_a_replaced_file_restarts(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("a\nb\n")
    follower = LogFollower(log)
    follower.start(tail=0)
    log.write_text("c\n")  # replaced by a shorter file
    assert follower.read() == ["c"]
    with log.open("a") as f:
        f.write("done")
    assert follower.rest() == ["done"]
