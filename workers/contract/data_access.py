"""Which files a job may read as data, checked at the moment each one is opened.

The API checks `data.path` once, at submit; after that a file can be swapped for a symlink,
a folder can hold symlinks that point out of it, and `data.tokenizer` names a file too. So
the worker opens each file first and then checks the file the open actually reached
(symlinks followed) against the data roots: nothing can change between check and read.

The service hands its rules to the worker processes in their environment
(`SHARDLINE_DATA_ROOTS`, `SHARDLINE_PRIVATE_DIRS`); `shardline train` on one machine sets
neither and reads whatever its user can.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

ROOTS_ENV = "SHARDLINE_DATA_ROOTS"
PRIVATE_ENV = "SHARDLINE_PRIVATE_DIRS"


class DataAccessDenied(PermissionError):
    """A job asked to read a file it may not read; the message names the job's own path."""


def _paths(value: str) -> tuple[Path, ...]:
    return tuple(Path(part).resolve() for part in value.split(",") if part.strip())


@dataclass(frozen=True)
class DataAccess:
    """`roots`: folders data may come from (None: anywhere); `private`: never data."""

    roots: tuple[Path, ...] | None = None
    private: tuple[Path, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ) -> DataAccess:
        roots = _paths(environ[ROOTS_ENV]) if ROOTS_ENV in environ else None
        return cls(roots, _paths(environ.get(PRIVATE_ENV, "")))

    @classmethod
    def of(cls, roots: list[Path], private: list[Path]) -> DataAccess:
        return cls(tuple(p.resolve() for p in roots), tuple(p.resolve() for p in private))

    def env_vars(self) -> dict[str, str]:
        """The environment that makes `from_env` return these rules in a worker."""
        out = {PRIVATE_ENV: ",".join(map(str, self.private))}
        if self.roots is not None:
            out[ROOTS_ENV] = ",".join(map(str, self.roots))
        return out

    def install(self, environ: MutableMapping[str, str] = os.environ) -> None:
        """Make `from_env(environ)` return these rules: set their variables and remove
        a roots variable these rules do not have (None: anywhere)."""
        environ.update(self.env_vars())
        if self.roots is None:
            environ.pop(ROOTS_ENV, None)

    def refusal(self, real: Path) -> str | None:
        """Why the file at resolved path `real` may not be read, or None if it may."""
        if any(real.is_relative_to(p) for p in self.private):
            return "is inside the service's own state or storage, which is never data"
        if self.roots is not None and not any(real.is_relative_to(r) for r in self.roots):
            return (
                f"is outside the data roots this server allows ({ROOTS_ENV}; symlinks are followed)"
            )
        return None

    def open(self, path: Path, field: str) -> BinaryIO:
        """Open `path` for reading; raise DataAccessDenied unless the opened file is allowed."""
        handle = open(path, "rb")  # noqa: SIM115 - returned to the caller, who closes it
        try:
            reason = self.refusal(_opened_file(handle, path))
            if reason is not None:
                # The path as the job named it: never the server's absolute roots.
                raise DataAccessDenied(f"{field}: {path} {reason}; use a file inside them")
        except BaseException:
            handle.close()
            raise
        return handle

    def check(self, path: Path, field: str) -> Path:
        """The resolved path of an allowed file (opened and checked, then closed)."""
        with self.open(path, field) as handle:
            return _opened_file(handle, path)


def _opened_file(handle: BinaryIO, path: Path) -> Path:
    """The file an open handle reached. On Linux /proc names it exactly, so a symlink
    swapped in after the open changes nothing; elsewhere resolve the path again."""
    if sys.platform.startswith("linux"):
        return Path(os.readlink(f"/proc/self/fd/{handle.fileno()}"))
    return path.resolve()
