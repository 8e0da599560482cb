"""A clock a unit test moves by hand (what a class takes as `clock=`)."""

from __future__ import annotations


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now
