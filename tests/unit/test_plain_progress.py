"""`follow` where stdout is not a terminal: a plain line when the step or state changes,
at most every few seconds while only the step moves, with the time left."""

from __future__ import annotations

from typing import Any

import pytest

from shardline.api.cli import watching
from shardline.api.cli.watching import PLAIN_EVERY_S, PlainProgress


def test_plain_lines_say_each_change_at_a_bounded_rate(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    said: list[str] = []
    monkeypatch.setattr(watching.time, "monotonic", lambda: now[0])
    monkeypatch.setattr(watching.console, "print", lambda line, **_: said.append(line))
    progress = PlainProgress("j1", 100)

    def seen(step: int, state: str, after_s: float) -> None:
        now[0] += after_s
        job: dict[str, Any] = {"step": step, "state": state, "latest_metrics": {"loss": 1.5}}
        progress.job(job)

    seen(0, "QUEUED", 0)
    seen(0, "STARTING", 1)  # a new state: said at once
    seen(0, "RUNNING", 1)
    seen(10, "RUNNING", 1)  # only the step moved, 1 s later: not yet
    seen(20, "RUNNING", PLAIN_EVERY_S)  # 20 steps in 6 s: 80 more take 24 s
    seen(100, "SUCCEEDED", 1)  # the end is always said
    assert [line.split("  ")[1:3] for line in said] == [
        ["step 0/100", "QUEUED"],
        ["step 0/100", "STARTING"],
        ["step 0/100", "RUNNING"],
        ["step 20/100", "RUNNING"],
        ["step 100/100", "SUCCEEDED"],
    ]
    assert said[3].endswith("loss 1.5000  eta 0m24s"), said[3]
