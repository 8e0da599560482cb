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
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

# One rank's trace: beyond this it is not kept (20 steps of a small model on CPU write a
# few MiB; a large model's kernels on GPU, tens).
MAX_TRACE_BYTES = 128 * 2**20


def trace_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.json"


def error_file(directory: Path, rank: int) -> Path:
    return directory / f"rank-{rank}.error"


class StepProfiler:
    """This rank's profile: armed with a folder and a step count, started after the next
    step ends, stopped and written after that many more."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._armed: tuple[Path, int] | None = None
        self._active: Any = None  # the running torch.profiler.profile
        self._folder = Path()
        self._left = 0
        self._first_step = 0

    def arm(self, directory: Path, steps: int) -> None:
        """Record the next `steps` steps into `directory` (called from another thread)."""
        with self._lock:
            self._armed = (directory, steps)

    def after_step(self, step: int) -> None:
        """On the training thread, after each step."""
        if self._active is not None:
            self._left -= 1
            if self._left == 0:
                self._finish(step)
            else:
                self._active.step()  # a new "ProfilerStep#n" span in the trace
        elif self._armed is not None:
            with self._lock:
                (self._folder, self._left), self._armed = self._armed, None
            self._start(step + 1)

    def abandon(self) -> None:
        """Training ended mid-profile: stop recording and write nothing."""
        if self._active is not None:
            try:
                self._active.stop()
            except Exception:  # ending anyway: nothing to save
                log.exception("rank %d: stopping the profiler failed", self.rank)
            self._active = None

    def _start(self, first_step: int) -> None:
        import torch
        from torch.profiler import ProfilerAction, ProfilerActivity, profile

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)
        self._first_step = first_step
        # A schedule that records every step: with one, each step is its own span.
        self._active = profile(
            activities=activities,
            schedule=lambda _: ProfilerAction.RECORD,
            record_shapes=False,
            with_stack=False,
        )
        self._active.start()
        log.info("profiling steps %d-%d", first_step, first_step + self._left - 1)

    def _finish(self, last_step: int) -> None:
        active, self._active = self._active, None
        folder = self._folder
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".rank-{self.rank}.json.partial"
        try:
            active.stop()
            active.export_chrome_trace(str(partial))
            size = partial.stat().st_size
            if size > MAX_TRACE_BYTES:
                partial.unlink()
                self._error(
                    folder,
                    f"the trace of rank {self.rank} is {size >> 20} MiB, over "
                    f"the {MAX_TRACE_BYTES >> 20} MiB a trace may take; profile fewer steps",
                )
                return
            os.replace(partial, trace_file(folder, self.rank))
            log.info("profile of steps %d-%d written (%d bytes)", self._first_step, last_step, size)
        except Exception as err:  # a profile must never stop training
            log.exception("rank %d: writing the profile failed", self.rank)
            partial.unlink(missing_ok=True)
            self._error(folder, f"rank {self.rank} could not write its trace: {err}")

    def _error(self, folder: Path, message: str) -> None:
        error_file(folder, self.rank).write_text(json.dumps({"error": message}))
