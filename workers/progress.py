"""A sequence-numbered buffer of what a job produced, for readers that ask "after n"."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class EntryKind(StrEnum):
    """What one buffered entry is; the reconciler writes each kind to its own place."""

    STATE = "state"  # state=, reason=
    EVENT = "event"  # message=, data=
    METRICS = "metrics"  # step=, values=
    CHECKPOINT = "checkpoint"  # step=, path=, bytes=, layout=, save_s=, blocking_s=
    SUMMARY = "summary"  # summary=


@dataclass
class ProgressBuffer:
    """Append-only; every entry gets the next sequence number, so a reader that remembers
    the last number it stored never sees an entry twice and never misses one."""

    entries: list[dict[str, Any]] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def append(self, kind: EntryKind, **payload: Any) -> int:
        with self._lock:
            seq = len(self.entries) + 1
            self.entries.append({"seq": seq, "kind": kind, **payload})
            return seq

    def after(self, seq: int, limit: int = 10_000) -> list[dict[str, Any]]:
        with self._lock:
            return self.entries[seq : seq + limit]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return len(self.entries)
