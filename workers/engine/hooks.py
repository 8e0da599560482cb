"""What a trainer tells the process that runs it: one hooks object, every hook optional.

A Ray worker reports metrics, events and commits to its supervisor and counts a step as
progress; `shardline train` sends rank 0's to the parent process; tests inject faults
after backward.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from torch import nn

from shardline.workers.contract.events import Event

log = logging.getLogger(__name__)


def _log_event(event: Event) -> None:
    log.info("%s", event.message)


@dataclass(frozen=True)
class TrainerHooks:
    # A logged step's metrics, on every rank (the runtime keeps rank 0's).
    on_metrics: Callable[[dict[str, Any]], None] | None = None
    # A step finished (after its save): the runtime's heartbeat and profiler.
    on_step: Callable[[int], None] | None = None
    # Progress short of a finished step (an async replica's push): not hung.
    on_progress: Callable[[], None] | None = None
    # After backward, before the optimizer step (step, this rank's modules): faults, a
    # slow rank in benchmarks.
    after_backward: Callable[[int, list[nn.Module]], None] | None = None
    # What the checkpoint manager says (restores, commits, skips; None: the rank's log),
    # and each commit.
    on_event: Callable[[Event], None] | None = None
    on_checkpoint: Callable[[dict[str, Any]], None] | None = None

    @property
    def event_sink(self) -> Callable[[Event], None]:
        return self.on_event or _log_event

    def metrics(self, metrics: dict[str, Any]) -> None:
        if self.on_metrics is not None:
            self.on_metrics(metrics)

    def step(self, step: int) -> None:
        if self.on_step is not None:
            self.on_step(step)

    def progress(self) -> None:
        if self.on_progress is not None:
            self.on_progress()

    def backward_done(self, step: int, modules: list[nn.Module]) -> None:
        if self.after_backward is not None:
            self.after_backward(step, modules)
