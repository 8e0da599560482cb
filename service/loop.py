"""A control-plane loop: call `tick()` every `interval_s` in a thread until stopped, and
at once when woken (something it acts on changed)."""

from __future__ import annotations

import logging
import threading

from shardline.service.outages import OutageLog, database_unavailable, first_line

log = logging.getLogger(__name__)


class PeriodicLoop:
    """Subclasses implement `tick`; an exception in one tick is logged (once while it
    repeats: service/outages.py), the next runs."""

    name = "loop"

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._failing: dict[str, OutageLog] = {}  # by the kind of failure

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
            except Exception as err:
                self._said_failing(err)
            else:
                for outage in self._failing.values():
                    outage.recovered()
                self._failing.clear()

    def _said_failing(self, err: Exception) -> None:
        """A database that does not answer is said in a line, a bug with its traceback,
        each once while the same failure repeats tick after tick."""
        down = database_unavailable(err)
        kind = "database" if down else f"{type(err).__name__}: {first_line(err)}"
        if kind not in self._failing:
            what = (
                f"{self.name}: the database does not answer; retrying every tick"
                if down
                else f"{self.name} tick failed; retrying"
            )
            self._failing[kind] = OutageLog(log, what)
        self._failing[kind].failed(first_line(err), traceback=not down)

    def tick(self) -> None:
        raise NotImplementedError
