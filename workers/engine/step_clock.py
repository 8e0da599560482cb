"""Where one step's time goes on this rank: data, compute, exposed communication, pipeline
bubble, and the checkpoint or snapshot that held training after it.

Armed only on logged steps: a disarmed clock hands out one shared no-op context, so an
unlogged step pays a method call per region and nothing else (no event, no sync). On a
GPU each region is timed by CUDA events on the current stream, read once the step has
synchronised; on a CPU by the wall clock around the same regions.

What each part holds:
- data: fetching this rank's batch and moving it to the device;
- compute: forward, backward and the optimizer step. Collectives that the data-parallel
  wrapper runs inside forward and backward (FSDP's gathers and reduce-scatters, DDP's
  bucketed all-reduce) count here: they overlap the layers' compute on a GPU;
- comm: the collectives the engine waits for itself (gradients averaged after backward,
  the global gradient norm, the loss, what a logged step gathers);
- bubble: under pipeline parallelism, the time in the schedule that this rank's stages
  spent not computing (waiting for a neighbour's activations or gradients);
- checkpoint: what a checkpoint or snapshot after the step held training (not in the
  step's own time).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

PARTS = ("data", "compute", "comm", "bubble", "checkpoint")
# The region a pipeline schedule runs in: split into compute and bubble by its chunks.
PIPELINE = "pipeline"
_IDLE: AbstractContextManager[None] = nullcontext()


class StepClock:
    """Seconds per part of the current step; `part(name)` times a region when armed."""

    def __init__(self, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        self.armed = False
        self._spans: list[tuple[str, Any, Any]] = []
        self._within_pipeline: list[tuple[Any, Any]] = []

    def arm(self, on: bool) -> None:
        """Start a step: measured when `on` (a logged step), else not at all."""
        self.armed = on
        self._spans.clear()
        self._within_pipeline.clear()

    def part(self, name: str) -> AbstractContextManager[None]:
        if not self.armed:
            return _IDLE
        return self._timed(name)

    @contextmanager
    def _timed(self, name: str) -> Iterator[None]:
        start = self._mark()
        try:
            yield
        finally:
            self._spans.append((name, start, self._mark()))

    def chunk(self, run: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap a pipeline stage's forward or backward of one micro-batch: what it runs is
        compute, and the rest of the schedule's time is bubble."""

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.armed:
                return run(*args, **kwargs)
            start = self._mark()
            try:
                return run(*args, **kwargs)
            finally:
                self._within_pipeline.append((start, self._mark()))

        return timed

    def seconds(self) -> dict[str, float]:
        """Each part's seconds this step (call after the step has synchronised)."""
        out = dict.fromkeys(PARTS, 0.0)
        pipeline = 0.0
        for name, start, end in self._spans:
            if name == PIPELINE:
                pipeline += self._elapsed(start, end)
            else:
                out[name] += self._elapsed(start, end)
        # Within the pipeline schedule, this rank's own chunks are compute; the rest of it
        # is bubble.
        chunks = sum(self._elapsed(start, end) for start, end in self._within_pipeline)
        out["compute"] += chunks
        out["bubble"] = max(pipeline - chunks, 0.0)
        return out

    def _mark(self) -> Any:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _elapsed(self, start: Any, end: Any) -> float:
        if self._cuda:
            return float(start.elapsed_time(end)) / 1000.0
        return float(end - start)
