"""Reading a rank's log file while its worker may still be appending to it.

Workers append to `storage_root/<job id>/logs/rank-<r>.log` on whatever node they run;
in a multi-node deployment storage_root is a shared filesystem mounted at the same path
on the API and every Ray node, so the control plane reads the same files. Where the files
are is not this module's business: callers pass the path.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

TAIL_BLOCK_BYTES = 64 * 1024
# Bounds on what one request reads, whatever the log's size: a tail reads at most the last
# TAIL_LIMIT_BYTES, a follow at most READ_LIMIT_BYTES per read, and a line longer than
# LINE_LIMIT_BYTES is cut there (a worker that prints without newlines must not make the
# API hold its whole output).
TAIL_LIMIT_BYTES = 4 * 1024 * 1024
READ_LIMIT_BYTES = 1024 * 1024
LINE_LIMIT_BYTES = 64 * 1024
# A search reads at most this much of the log's end.
SEARCH_LIMIT_BYTES = 64 * 1024 * 1024


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a log (none if it does not exist yet, or count is 0).

    Reads backwards from the end in blocks, never more than TAIL_LIMIT_BYTES: the status
    page asks for a tail every few seconds, and a long job's log can be large.
    """
    if count == 0 or not path.is_file():
        return []
    with path.open("rb") as f:
        return _tail(f, f.seek(0, 2), count)


def _tail(f: BinaryIO, end: int, count: int) -> list[str]:
    """The last `count` lines of the file's first `end` bytes."""
    data, start = b"", end
    # One newline more than `count`, so the first line kept is whole.
    while start > 0 and data.count(b"\n") <= count and end - start < TAIL_LIMIT_BYTES:
        start = max(0, start - TAIL_BLOCK_BYTES, end - TAIL_LIMIT_BYTES)
        f.seek(start)
        data = f.read(end - start)
    lines = _decode(data)
    if start > 0 and len(lines) > 1:
        lines = lines[1:]  # the first is cut, and there are whole ones after it
    return lines[-count:]


@dataclass
class LogFollower:
    """Reads the complete lines appended to a log since the last read.

    Starts at the end of the last `tail` lines. A line still being written (no newline
    yet) waits for the next read; a file that shrank (rotated or replaced) is re-read from
    its start. Each call reads at most READ_LIMIT_BYTES; `behind` says more is waiting.
    """

    path: Path
    offset: int = 0
    partial: bytes = b""
    behind: bool = False

    def start(self, tail: int) -> list[str]:
        """The last `tail` lines now; later reads return what follows them."""
        if not self.path.is_file():
            return []
        with self.path.open("rb") as f:
            end = f.seek(0, 2)
            # Whole lines only: follow from just after the last newline.
            cut = end
            while cut > 0 and end - cut < TAIL_LIMIT_BYTES:
                block = max(0, cut - TAIL_BLOCK_BYTES)
                f.seek(block)
                newline = f.read(cut - block).rfind(b"\n")
                if newline >= 0:
                    cut = block + newline + 1
                    break
                cut = block
            self.offset, self.partial = cut, b""
            return _tail(f, cut, tail) if tail and cut else []

    def read(self) -> list[str]:
        if not self.path.is_file():
            return []
        size = self.path.stat().st_size
        if size < self.offset:
            self.offset, self.partial = 0, b""
        self.behind = size - self.offset > READ_LIMIT_BYTES
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(min(size - self.offset, READ_LIMIT_BYTES))
        self.offset += len(chunk)
        data = self.partial + chunk
        cut = data.rfind(b"\n") + 1
        lines, self.partial = _decode(data[:cut]), data[cut:]
        while len(self.partial) > LINE_LIMIT_BYTES:  # no newline in sight: send it in pieces
            piece, self.partial = self.partial[:LINE_LIMIT_BYTES], self.partial[LINE_LIMIT_BYTES:]
            lines.append(piece.decode("utf-8", errors="replace"))
        return lines

    def rest(self) -> list[str]:
        """After the writer has stopped: new lines, and once the end is reached (not
        `behind`), a last line with no newline."""
        lines = self.read()
        if self.partial and not self.behind:
            lines.append(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""
        return lines


def search_lines(path: Path, text: str, count: int) -> list[str]:
    """The last `count` lines that contain `text` (case-insensitive), searched in the last
    SEARCH_LIMIT_BYTES of the log: a search reads forward through the file, and a job that
    has run for weeks may have written more than a request should read."""
    if count == 0 or not path.is_file():
        return []
    needle = text.casefold()
    found: deque[str] = deque(maxlen=count)
    with path.open("rb") as f:
        start = max(0, f.seek(0, 2) - SEARCH_LIMIT_BYTES)
        f.seek(start)
        if start:
            f.readline()  # cut by the limit: not a whole line
        for raw in f:
            line = raw[:LINE_LIMIT_BYTES].decode("utf-8", errors="replace").rstrip("\r\n")
            if needle in line.casefold():
                found.append(line)
    return list(found)


def _decode(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()
