"""Profiles on demand: a rank asked to (through its supervisor) records its next N steps
with torch.profiler and writes them as a Chrome trace, `rank-R.json` in the profile's
folder; the control plane merges the ranks' traces into one (service/profiles.py).

Armed from the actor's thread, run on the training thread between steps. A rank that was
not asked pays one attribute check per step. The trace is written to a temporary name
and renamed, so a reader never sees half of one; a trace larger than MAX_TRACE_BYTES is
replaced by `rank-R.error`, which says why.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# One rank's trace: beyond this it is not kept (20 steps of a small model on CPU write a
# few MiB; a large model's kernels on GPU, tens).
MAX_TRACE_BYTES = 64 * 2**20


class AlreadyProfiling(RuntimeError):
    """This rank records a profile already (the API answers 409)."""


def write_atomically(path: Path, text: str | Iterable[str]) -> None:
    """`text` (or its pieces, in order) as `path`, which no reader sees half-written."""
    partial = path.with_name(f".{path.name}.partial")
    with partial.open("w", encoding="utf-8") as out:
        out.writelines([text] if isinstance(text, str) else text)
    os.replace(partial, path)


def trace_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.json"


def error_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.error"


class StepProfiler:
    """This rank's profile: armed with a folder and a step count, started after the next
    step ends, stopped and written after that many more. Armed until it is written or
    has failed: a second arm meanwhile is refused."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._armed: tuple[Path, int] | None = None
        self._active: Any = None  # the running torch.profiler.profile
        self._folder = Path()
        self._left = 0
        self._first_step = 0

    def arm(self, directory: Path, steps: int) -> None:
        """Record the next `steps` steps into `directory` (called from another thread);
        AlreadyProfiling while another is armed or recording."""
        with self._lock:
            if self._armed is not None:
                raise AlreadyProfiling(f"rank {self.rank} is recording a profile already")
            self._armed = (directory, steps)

    def after_step(self, step: int) -> None:
        """On the training thread, after each step. A profile that fails says why in
        `rank-R.error`; training goes on."""
        if self._armed is None:  # the usual case: one attribute read
            return
        try:
            if self._active is None:
                self._folder, self._left = self._armed
                self._start(step + 1)
                return
            self._left -= 1
            if self._left > 0:
                self._active.step()  # a new "ProfilerStep#n" span in the trace
                return
            self._finish(step)
        except Exception as err:  # a profile must never stop training
            log.exception("rank %d: the profile failed", self.rank)
            self._error(f"rank {self.rank}'s profile failed: {type(err).__name__}: {err}")
        self.abandon()  # written or failed: stop recording, and another may be armed

    def abandon(self) -> None:
        """Stop recording, if it still does, and write nothing (also when training ends
        mid-profile)."""
        active, self._active = self._active, None
        if active is not None:
            try:
                active.stop()
            except Exception:  # ending anyway: nothing to save
                log.exception("rank %d: stopping the profiler failed", self.rank)
        with self._lock:
            self._armed = None

    def _start(self, first_step: int) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._first_step = first_step
        # A schedule that records every step: with one, each step is its own span.
        active = profile(
            activities=activities,
            schedule=lambda _: ProfilerAction.RECORD,
            record_shapes=False,
            with_stack=False,
        )
        active.start()
        self._active = active
        log.info("profiling steps %d-%d", first_step, first_step + self._left - 1)

    def _finish(self, last_step: int) -> None:
        active, self._active = self._active, None
        active.stop()
        self._folder.mkdir(parents=True, exist_ok=True)
        partial = self._folder / f".rank-{self.rank}.json.partial"
        try:
            active.export_chrome_trace(str(partial))
            size = partial.stat().st_size
            if size > MAX_TRACE_BYTES:
                raise ValueError(
                    f"its trace is {size >> 20} MiB, over the {MAX_TRACE_BYTES >> 20} MiB "
                    "a trace may take; profile fewer steps"
                )
            os.replace(partial, trace_file(self._folder, self.rank))
        finally:
            partial.unlink(missing_ok=True)
        log.info("profile of steps %d-%d written (%d bytes)", self._first_step, last_step, size)

    def _error(self, message: str) -> None:
        try:
            self._folder.mkdir(parents=True, exist_ok=True)
            write_atomically(error_file(self._folder, self.rank), json.dumps({"error": message}))
        except OSError:
            log.exception("rank %d: could not say why its profile failed", self.rank)
