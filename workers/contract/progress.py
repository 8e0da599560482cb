"""A sequence-numbered buffer of what a job produced, for readers that ask "after n".

One frozen dataclass per kind of entry, so the reconciler and the store read attributes,
not string keys. They hold only plain data (no torch, no Ray), and the control plane
unpickles them when it reads a supervisor: this module is safe for it to import.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, ClassVar, TypedDict


class EntryKind(StrEnum):
    """What one buffered entry is; the reconciler writes each kind to its own place."""

    STATE = "state"
    EVENT = "event"
    METRICS = "metrics"
    CHECKPOINT = "checkpoint"
    SUMMARY = "summary"


@dataclass(frozen=True)
class CheckpointCommit:
    """A checkpoint rank 0 committed, as the database records it."""

    step: int
    path: str
    bytes: int
    layout: str
    save_s: float
    blocking_s: float
    deleted: list[int] = field(default_factory=list)  # steps keep_last pruned with it

    @classmethod
    def from_summary(cls, summary: dict[str, Any]) -> CheckpointCommit:
        """From the engine's commit summary (workers/engine/checkpoint/tier.py)."""
        return cls(
            step=summary["step"],
            path=summary["path"],
            bytes=summary["bytes"],
            layout=summary["layout"],
            save_s=summary["save_s"],
            blocking_s=summary["blocking_s"],
            deleted=list(summary.get("deleted") or []),
        )


# `seq` is keyword-only with a placeholder: the buffer stamps the real one on append.
@dataclass(frozen=True, kw_only=True)
class StateEntry:
    kind: ClassVar[EntryKind] = EntryKind.STATE
    state: str  # a JobState value
    reason: str
    seq: int = 0


@dataclass(frozen=True, kw_only=True)
class EventEntry:
    kind: ClassVar[EntryKind] = EntryKind.EVENT
    message: str
    data: dict[str, Any] = field(default_factory=dict)
    seq: int = 0


@dataclass(frozen=True, kw_only=True)
class MetricsEntry:
    kind: ClassVar[EntryKind] = EntryKind.METRICS
    step: int
    values: dict[str, Any]  # the step's metrics as logged (open-ended names, stored as JSON)
    seq: int = 0


@dataclass(frozen=True, kw_only=True)
class CheckpointEntry:
    kind: ClassVar[EntryKind] = EntryKind.CHECKPOINT
    commit: CheckpointCommit
    seq: int = 0


@dataclass(frozen=True, kw_only=True)
class SummaryEntry:
    kind: ClassVar[EntryKind] = EntryKind.SUMMARY
    summary: dict[str, Any] | None
    seq: int = 0


ProgressEntry = StateEntry | EventEntry | MetricsEntry | CheckpointEntry | SummaryEntry


class ProgressRead(TypedDict):
    """What a supervisor's `read()` answers: a plain dict across Ray."""

    entries: list[ProgressEntry]
    state: str  # the supervisor's JobState value now
    last_seq: int


@dataclass
class ProgressBuffer:
    """Append-only; every entry gets the next sequence number, so a reader that remembers
    the last number it stored never sees an entry twice and never misses one."""

    entries: list[ProgressEntry] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def append(self, entry: ProgressEntry) -> int:
        with self._lock:
            seq = len(self.entries) + 1
            self.entries.append(replace(entry, seq=seq))
            return seq

    def after(self, seq: int, limit: int = 10_000) -> list[ProgressEntry]:
        with self._lock:
            return self.entries[seq : seq + limit]

    @property
    def last_seq(self) -> int:
        with self._lock:
            return len(self.entries)
