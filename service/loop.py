"""A control-plane loop: call `tick()` every `interval_s` in a thread until stopped, and
at once when woken (something it acts on changed)."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)


class PeriodicLoop:
    """Subclasses implement `tick`; an exception in one tick is logged, the next runs."""

    name = "loop"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout=30)

    def wake(self) -> None:
        """Run the next tick now rather than at the end of the interval (wakes that come
        while a tick runs make one more tick after it)."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self.interval_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self.tick()
            except Exception:
                log.exception("%s tick failed; retrying", self.name)

    def tick(self) -> None:
        raise NotImplementedError
