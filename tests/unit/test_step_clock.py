"""The step clock on a CPU: regions timed only when armed; a pipeline's chunks are compute
and the rest of its schedule is bubble."""

from __future__ import annotations

import time

import torch

from shardline.workers.engine.step_clock import PARTS, PIPELINE, StepClock


def test_a_disarmed_clock_times_nothing() -> None:
    clock = StepClock(torch.device("cpu"))
    clock.arm(False)
    first, second = clock.part("compute"), clock.part("data")
    assert first is second  # one shared no-op: an unlogged step builds nothing per region
    with first:
        time.sleep(0.01)
    assert clock.seconds() == dict.fromkeys(PARTS, 0.0)


def test_armed_regions_add_up_per_part() -> None:
    clock = StepClock(torch.device("cpu"))
    clock.arm(True)
    with clock.part("data"):
        time.sleep(0.02)
    for _ in range(2):
        with clock.part("comm"):
            time.sleep(0.01)
    got = clock.seconds()
    # A sleep never ends early; a loaded machine can make it end late.
    assert 0.02 <= got["data"] < 0.2
    assert 0.02 <= got["comm"] < 0.2
    assert got["compute"] == got["bubble"] == 0.0
    clock.arm(True)  # the next step starts from nothing
    assert clock.seconds()["data"] == 0.0


def test_pipeline_time_outside_the_chunks_is_bubble() -> None:
    clock = StepClock(torch.device("cpu"))
    chunk = clock.chunk(lambda seconds: time.sleep(seconds))
    clock.arm(True)
    with clock.part(PIPELINE):
        chunk(0.03)
        time.sleep(0.02)  # waiting for the neighbour stage
        chunk(0.03)
    got = clock.seconds()
    assert 0.06 <= got["compute"] < 0.6
    assert 0.019 < got["bubble"] < 0.2  # the wait between the chunks, however late it ends
    clock.arm(False)
    chunk(0.01)  # a disarmed clock still runs the chunk, and times nothing
    assert clock.seconds()["compute"] == 0.0
