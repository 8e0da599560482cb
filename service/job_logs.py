"""Reading a rank's log file while its worker may still be appending to it.

Workers append to `storage_root/<job id>/logs/rank-<r>.log` on whatever node they run;
in a multi-node deployment storage_root is a shared filesystem mounted at the same path
on the API and every Ray node, so the control plane reads the same files. Where the files
are is not this module's business: callers pass the path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TAIL_BLOCK_BYTES = 64 * 1024


def tail_lines(path: Path, count: int) -> list[str]:
    """The last `count` lines of a log (none if it does not exist yet, or count is 0).

    Reads backwards from the end in blocks: the status page asks for a tail every few
    seconds, and a long job's log can be large.
    """
    if count == 0 or not path.is_file():
        return []
    with path.open("rb") as f:
        end = f.seek(0, 2)
        data, start = b"", end
        # One newline more than `count`, so the first line kept is whole.
        while start > 0 and data.count(b"\n") <= count:
            start = max(0, start - TAIL_BLOCK_BYTES)
            f.seek(start)
            data = f.read(end - start)
    return _decode(data)[-count:] if start == 0 else _decode(data)[1:][-count:]


@dataclass
class LogFollower:
    """Reads the complete lines appended to a log since the last read.

    Starts at the end of the last `tail` lines. A line still being written (no newline
    yet) waits for the next read; a file that shrank (rotated or replaced) is re-read from
    its start.
    """

    path: Path
    offset: int = 0
    partial: bytes = b""

    def start(self, tail: int) -> list[str]:
        """The last `tail` lines now; later reads return what follows them."""
        if not self.path.is_file():
            return []
        data = self.path.read_bytes()
        complete = data[: data.rfind(b"\n") + 1]
        self.offset = len(complete)
        self.partial = b""
        return _decode(complete)[-tail:] if tail else []

    def read(self) -> list[str]:
        if not self.path.is_file():
            return []
        size = self.path.stat().st_size
        if size < self.offset:
            self.offset, self.partial = 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        self.offset += len(chunk)
        data = self.partial + chunk
        cut = data.rfind(b"\n") + 1
        self.partial = data[cut:]
        return _decode(data[:cut])

    def rest(self) -> list[str]:
        """After the writer has stopped: new lines and a last line with no newline."""
        lines = self.read()
        if self.partial:
            lines.append(self.partial.decode("utf-8", errors="replace"))
            self.partial = b""
        return lines


def _decode(data: bytes) -> list[str]:
    return data.decode("utf-8", errors="replace").splitlines()
