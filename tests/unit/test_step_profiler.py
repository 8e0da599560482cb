"""A rank's profile on demand: torch.profiler over exactly the steps asked for, written
whole or not at all (real torch on CPU; the steps are small matrix products)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from shardline.workers.runtime import profiling
from shardline.workers.runtime.profiling import (
    AlreadyProfiling,
    StepProfiler,
    error_file,
    trace_file,
)


def train(profiler: StepProfiler, steps: range) -> None:
    x = torch.randn(64, 64)
    for step in steps:
        for _ in range(3):
            x = torch.tanh(x @ x.T / 64)
        profiler.after_step(step)


def test_the_steps_asked_for_are_recorded_and_written_whole(tmp_path: Path) -> None:
    profiler = StepProfiler(rank=1)
    train(profiler, range(1, 3))  # not armed: nothing recorded
    assert not tmp_path.exists() or not any(tmp_path.iterdir())
    profiler.arm(tmp_path / "p", 3)
    train(profiler, range(3, 6))  # armed after step 3: records 4, 5, 6
    assert not (tmp_path / "p").exists()  # not before its last step
    train(profiler, range(6, 9))
    trace = json.loads(trace_file(tmp_path / "p", 1).read_text())
    steps = {e["name"] for e in trace["traceEvents"] if e["name"].startswith("ProfilerStep#")}
    assert len(steps) == 3, steps
    assert any(e["name"] == "aten::mm" for e in trace["traceEvents"])
    assert [p.name for p in (tmp_path / "p").iterdir()] == ["rank-1.json"]  # no partial left


def test_a_trace_over_the_limit_is_replaced_by_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(profiling, "MAX_TRACE_BYTES", 100)
    profiler = StepProfiler(rank=0)
    profiler.arm(tmp_path, 2)
    train(profiler, range(1, 5))
    assert not trace_file(tmp_path, 0).exists()
    said = json.loads(error_file(tmp_path, 0).read_text())["error"]
    assert "over the 0 MiB a trace may take; profile fewer steps" in said


def test_training_that_ends_mid_profile_writes_nothing(tmp_path: Path) -> None:
    profiler = StepProfiler(rank=0)
    profiler.arm(tmp_path / "p", 5)
    train(profiler, range(1, 4))
    profiler.abandon()
    train(profiler, range(4, 9))  # nothing armed any more
    assert not (tmp_path / "p").exists()


def test_one_profile_at_a_time_and_a_failing_one_never_stops_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    profiler = StepProfiler(rank=2)
    profiler.arm(tmp_path / "a", 2)
    with pytest.raises(AlreadyProfiling):
        profiler.arm(tmp_path / "b", 2)
    train(profiler, range(1, 5))
    assert trace_file(tmp_path / "a", 2).is_file()

    def broken(*_: object) -> None:
        raise RuntimeError("profiler already enabled")

    monkeypatch.setattr(torch.profiler.profile, "start", broken)
    profiler.arm(tmp_path / "c", 2)  # the first is written: another may be armed
    train(profiler, range(5, 9))  # its start raises: training goes on
    said = json.loads(error_file(tmp_path / "c", 2).read_text())["error"]
    assert said == "rank 2's profile failed: RuntimeError: profiler already enabled"
    profiler.arm(tmp_path / "d", 1)  # and a failed one holds nothing back either
