"""Metrics rank 0 logged to the job's metrics file that may never have reached the
database: a killed rank 0 held them since the last poll, or a lost supervisor did."""

from __future__ import annotations

import json
from pathlib import Path

from workers.contract.status import StepMetrics


def logged_metrics_after(metrics_file: Path, step: int) -> list[StepMetrics]:
    """The metrics logged for steps after `step`, in the order they were logged."""
    if not metrics_file.is_file():
        return []
    found: list[StepMetrics] = []
    for line in metrics_file.read_text(encoding="utf-8").splitlines():
        try:
            metrics = json.loads(line)
        except json.JSONDecodeError:  # a line cut short when its writer died
            continue
        if metrics["step"] > step:
            found.append(metrics)
    return found
