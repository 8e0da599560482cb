"""A control-plane loop: call `tick()` every `interval_s` in a thread until stopped."""

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
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.tick()
            except Exception:
                log.exception("%s tick failed; retrying", self.name)

    def tick(self) -> None:
        raise NotImplementedError
