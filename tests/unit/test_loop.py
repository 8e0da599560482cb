"""PeriodicLoop: a tick every interval, one at once when woken, and a prompt stop."""

from __future__ import annotations

import threading
import time

from shardline.service.loop import PeriodicLoop


class Counting(PeriodicLoop):
    name = "counting"

    def __init__(self, interval_s: float) -> None:
        super().__init__(interval_s)
        self.ticks = 0
        self.ticked = threading.Event()

    def tick(self) -> None:
        self.ticks += 1
        self.ticked.set()


def test_a_woken_loop_ticks_at_once_not_at_the_end_of_its_interval() -> None:
    loop = Counting(interval_s=60.0)
    loop.start()
    try:
        assert not loop.ticked.wait(0.3)  # nothing before the interval...
        started = time.monotonic()
        loop.wake()  # ...until something it acts on changed
        assert loop.ticked.wait(5.0)
        assert time.monotonic() - started < 5.0
        assert loop.ticks == 1
    finally:
        began = time.monotonic()
        loop.stop()
        assert time.monotonic() - began < 5.0, "stop waited for the interval"


def test_an_unwoken_loop_ticks_every_interval() -> None:
    loop = Counting(interval_s=0.05)
    loop.start()
    try:
        deadline = time.monotonic() + 10
        while loop.ticks < 3:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        loop.stop()
