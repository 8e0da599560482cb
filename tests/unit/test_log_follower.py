"""Reading a log that another process appends to: whole lines only, none twice."""

from __future__ import annotations

from pathlib import Path

from shardline.service.job_logs import (
    LINE_LIMIT_BYTES,
    READ_LIMIT_BYTES,
    TAIL_LIMIT_BYTES,
    LogFollower,
    tail_lines,
)


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


def test_tail_reads_whole_lines_from_the_end_of_a_large_log(tmp_path: Path) -> None:
    log = tmp_path / "rank-0.log"
    lines = [f"step {i} loss {i / 7:.4f}" for i in range(20_000)]  # ~450 KB: several blocks
    log.write_text("\n".join(lines) + "\n")
    assert tail_lines(log, 3) == lines[-3:]
    assert tail_lines(log, 5000) == lines[-5000:]
    assert tail_lines(log, 50_000) == lines
    log.write_text("no newline at the end")
    assert tail_lines(log, 2) == ["no newline at the end"]
    assert tail_lines(tmp_path / "missing.log", 2) == []


def test_a_huge_log_is_followed_in_bounded_reads_and_every_line_comes_once(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rank-0.log"
    old = [f"old {i:07d}" for i in range(400_000)]  # ~4.4 MB before the follow starts
    log.write_text("\n".join(old) + "\n")
    follower = LogFollower(log)
    assert follower.start(tail=2) == old[-2:]
    new = [f"new {i:07d}" for i in range(300_000)]  # ~3.3 MB appended at once
    with log.open("a") as f:
        f.write("\n".join(new) + "\n")
    got: list[str] = []
    reads = 0
    while batch := follower.read():
        # At most one read's bytes and the start of a line the read before left whole.
        assert sum(len(line) + 1 for line in batch) <= READ_LIMIT_BYTES + LINE_LIMIT_BYTES
        got += batch
        reads += 1
    assert got == new
    assert reads >= 3
    assert not follower.behind


def test_a_line_without_newlines_comes_in_pieces_and_the_tail_reads_a_bounded_end(
    tmp_path: Path,
) -> None:
    log = tmp_path / "rank-0.log"
    log.write_text("start\n")
    follower = LogFollower(log)
    follower.start(tail=0)
    with log.open("a") as f:
        f.write("x" * (3 * LINE_LIMIT_BYTES + 5))
    pieces = follower.read()
    assert [len(p) for p in pieces] == [LINE_LIMIT_BYTES] * 3
    assert follower.rest() == ["x" * 5]
    # A tail whose last line is longer than the tail limit is that line's end, cut.
    with log.open("a") as f:
        f.write("y" * TAIL_LIMIT_BYTES + "end\n")
    (tail,) = tail_lines(log, 5)
    assert len(tail) < TAIL_LIMIT_BYTES
    assert tail.endswith("yend")
