"""Faults an admin injects into a running job, to test and measure recovery (chaos tests).

Each kind imitates a real failure at the place it happens: `kill` ends the rank's process
the way the OOM killer would; `hang` stops its training thread between two steps (a
wedged collective, a stuck filesystem); `raise` makes its next step raise; `nan` poisons
its weights so that the next step's loss is not finite (what a diverging run does).
No torch at import; the kinds themselves are in workers/contract/faults.py.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from shardline.workers.contract.faults import FaultKind

log = logging.getLogger(__name__)

# A killed rank answers the request first, then dies: the caller learns it was delivered.
KILL_DELAY_S = 0.2


class InjectedFault(RuntimeError):
    """The error a `raise` fault makes a step throw (an infrastructure error: retried)."""


class ArmedFaults:
    """The faults waiting for this rank's training thread to reach them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._armed: set[FaultKind] = set()
        self._never = threading.Event()  # what a hung thread waits on

    def inject(self, kind: FaultKind) -> None:
        log.warning("fault injected: %s", kind.value)
        if kind == FaultKind.KILL:
            threading.Timer(KILL_DELAY_S, os.kill, (os.getpid(), signal.SIGKILL)).start()
            return
        with self._lock:
            self._armed.add(kind)

    def _take(self, kind: FaultKind) -> bool:
        with self._lock:
            if kind in self._armed:
                self._armed.discard(kind)
                return True
            return False

    def before_step_done(self, parameters: Callable[[], Any]) -> None:
        """Called on the training thread after a step, before it counts as progress."""
        if not self._armed:  # the usual case: no lock, no walk over the parameters
            return
        if self._take(FaultKind.NAN):
            _poison(parameters())
        if self._take(FaultKind.HANG):
            log.warning("fault: the training thread blocks now")
            self._never.wait()

    def during_step(self, step: int, _modules: Any) -> None:
        """The trainer's grad hook: after backward, before the optimizer step."""
        if self._armed and self._take(FaultKind.RAISE):
            raise InjectedFault(f"injected fault: step {step} raised")


def _poison(parameters: Any) -> None:
    """Fill this rank's part of every parameter with NaN. Its peers read those values in
    the next forward (gradients are averaged, shards gathered, activations passed on), so
    the next step's loss is NaN on every rank, as from a real divergence."""
    import torch

    from shardline.workers.engine.dtensor import local_part

    with torch.no_grad():
        for p in parameters:
            local_part(p).fill_(float("nan"))
    log.warning("fault: this rank's weights are NaN now")
