"""bench/recovery.py's figures over trials: nearest-rank percentiles (of 10 trials, p99 is
the slowest) and the per-kind summary."""

from __future__ import annotations

import math
from typing import Any

import pytest

from bench.recovery import max_relative_difference, percentile, summary


def trial(mttr: float | None, lost: int = 2, done: bool = True) -> dict[str, Any]:
    return {
        "restart": "in place",
        "state": "SUCCEEDED" if done else "FAILED",
        "mttr_s": mttr,
        # Noticing the failure and taking the old ranks down: 0.4 s more.
        "fault_to_step_s": None if mttr is None else mttr + 0.4,
        "steps_lost": lost,
        "goodput": 0.9,
        "every_step_once": done,
    }


def test_percentiles_are_nearest_rank() -> None:
    ten = [float(v) for v in (7, 1, 3, 10, 2, 9, 4, 8, 6, 5)]
    assert (percentile(ten, 50), percentile(ten, 99), percentile(ten, 90)) == (5.0, 10.0, 9.0)
    assert percentile([4.0], 99) == 4.0


def test_the_summary_counts_every_trial() -> None:
    got = summary("kill", [trial(1.2), trial(3.4, lost=4), trial(None, done=False)])
    assert got == {
        "fault": "kill",
        "restart": "in place",
        "trials": 3,
        "measured": 2,
        "succeeded": 2,
        "every_step_once": False,
        "mttr_p50_s": 1.2,
        "mttr_p99_s": 3.4,
        "fault_to_step_p50_s": 1.6,
        "fault_to_step_p99_s": 3.8,
        "steps_lost_mean": 2.7,
        "goodput_mean": 0.9,
    }


def test_node_trials_report_their_largest_loss_difference() -> None:
    assert max_relative_difference([2.0, 1.01], [2.0, 1.0]) == pytest.approx(0.01)
    assert max_relative_difference([2.0], [2.0, 1.0]) == math.inf  # a step missing
    node = [trial(5.0) | {"max_loss_rel_diff": d} for d in (1e-7, 3.4e-6, None)]
    assert summary("node_loss", node)["max_loss_rel_diff"] == 3.4e-6
