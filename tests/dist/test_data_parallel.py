"""Data parallelism at dp=4 with every ZeRO stage trains exactly like one process."""

from __future__ import annotations

from typing import Any

import pytest

from tests.dist.runs import run, tiny_spec


@pytest.fixture(scope="module")
def single_process() -> list[dict[str, Any]]:
    metrics, _ = run(tiny_spec())
    return metrics


@pytest.fixture(scope="module")
def zero_runs() -> dict[int, list[dict[str, Any]]]:
    return {
        stage: run(tiny_spec(parallel={"dp": 4, "zero_stage": stage}))[0]
        for stage in (0, 1, 2, 3)
    }


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_every_step_loss_matches_single_process(
    stage: int, single_process: list[dict[str, Any]], zero_runs: dict[int, list[dict[str, Any]]]
) -> None:
    ours = zero_runs[stage]
    assert [m["step"] for m in ours] == list(range(1, 11))
    for ref, got in zip(single_process, ours, strict=True):
        assert got["loss"] == pytest.approx(ref["loss"], rel=1e-5), f"step {got['step']}"
        assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
    # The run must actually learn, or equal losses would prove little.
    assert ours[-1]["loss"] < ours[0]["loss"] * 0.9


def test_zero_stages_shrink_what_each_rank_holds(
    single_process: list[dict[str, Any]], zero_runs: dict[int, list[dict[str, Any]]]
) -> None:
    full = single_process[-1]["mem_bytes"]
    held = {stage: runs[-1]["mem_bytes"] for stage, runs in zero_runs.items()}

    def fraction(stage: int, kind: str) -> float:
        return held[stage][kind] / full[kind]

    # zero-0 replicates everything.
    assert held[0] == full
    assert fraction(1, "optim") <= 0.30
    assert fraction(1, "grads") == 1.0
    assert fraction(2, "optim") <= 0.30 and fraction(2, "grads") <= 0.30
    assert fraction(3, "optim") <= 0.30 and fraction(3, "grads") <= 0.30
    assert fraction(3, "params") <= 0.30
