"""A logged step's part of each rank travels as one flat row and comes back by name."""

from __future__ import annotations

from shardline.workers.engine.accounting import MEMORY_KINDS
from shardline.workers.engine.metrics import RankReport
from shardline.workers.engine.step_clock import PARTS


def test_a_rank_report_comes_back_from_its_row_by_name() -> None:
    report = RankReport(
        memory={kind: 1000 * (i + 1) for i, kind in enumerate(MEMORY_KINDS)},
        parts={part: 0.5 * (i + 1) for i, part in enumerate(PARTS)},
        step_s=3.25,
    )
    assert RankReport.from_row(report.row()) == report
    row = report.breakdown(rank=3)
    assert row["rank"] == 3 and row["step_s"] == 3.25
    assert row["checkpoint_s"] == report.parts["checkpoint"]
    assert row["mem_bytes"] == sum(report.memory.values())
