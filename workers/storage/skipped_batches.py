"""Batches a job skipped after a non-finite loss, and which batch each step trains.

Without skips, step s trains batch s (a pure function of (seed, s)). Skipping a batch
shifts every later step to the next batch not skipped, so the data order is a pure
function of (seed, step, skipped batches). The skipped batches are recorded next to the
job's checkpoints and only ever added to, so any checkpoint, restored at any time, resumes
with exactly the batch an uninterrupted run with the same skips would train.

No torch here: the supervisor records skips, the engine reads them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from fsspec.core import url_to_fs
from fsspec.implementations.local import LocalFileSystem

log = logging.getLogger(__name__)

RECORD = "skipped-batches.json"


def batch_index(step: int, skipped: Iterable[int]) -> int:
    """The batch that step `step` trains: the step-th batch index not skipped."""
    index = step
    for batch in sorted(set(skipped)):
        if batch <= index:
            index += 1
    return index


class SkippedBatches:
    """The record in a job's checkpoints folder (a local path or an fsspec URL)."""

    def __init__(self, checkpoints_url: str) -> None:
        self.fs, root = url_to_fs(checkpoints_url.rstrip("/"))
        self.path = f"{root}/{RECORD}"

    def read(self) -> list[dict[str, int]]:
        """Every skip so far, oldest first: {"step": s, "batch": b}."""
        if not self.fs.exists(self.path):
            return []
        with self.fs.open(self.path, "r", encoding="utf-8") as f:
            return list(json.load(f)["skipped"])

    def batches(self) -> list[int]:
        return [entry["batch"] for entry in self.read()]

    def add(self, step: int, batch: int) -> None:
        """Record that step `step` no longer trains batch `batch` (written whole, then
        renamed, so a reader never sees half a record)."""
        entries = [*self.read(), {"step": step, "batch": batch}]
        if isinstance(self.fs, LocalFileSystem):  # an object store has no folders to make
            self.fs.makedirs(self.path.rsplit("/", 1)[0], exist_ok=True)
        staging = f"{self.path}.tmp"
        with self.fs.open(staging, "w", encoding="utf-8") as f:
            json.dump({"skipped": entries}, f)
        self.fs.mv(staging, self.path)
        log.info("skipping batch %d at step %d from now on", batch, step)
