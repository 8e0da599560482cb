"""Running a spec on several local processes (gloo) and collecting its per-step metrics."""

from __future__ import annotations

from typing import Any

from shardline.workers.engine.launch import train_local
from shardline.workers.contract.spec import JobSpec


def tiny_spec(**overrides: Any) -> JobSpec:
    """The equivalence tests' spec: tiny model, fp32, 10 steps, every step logged."""
    base: dict[str, Any] = {
        "name": "equivalence",
        "model": {"preset": "tiny", "seq_len": 64},
        "data": {"source": "synthetic"},
        "precision": "fp32",
        "train": {
            "steps": 10,
            "global_batch_size": 8,
            "micro_batch_size": 2,
            "lr": 3e-3,
            "warmup_steps": 2,
            "log_every": 1,
            "seed": 7,
        },
    }
    for section, values in overrides.items():
        if isinstance(values, dict):
            base[section] = {**base.get(section, {}), **values}
        else:
            base[section] = values
    return JobSpec.model_validate(base)


def run(spec: JobSpec) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """All logged steps' metrics and the summary."""
    metrics: list[dict[str, Any]] = []
    summary = train_local(spec, spec.parallel.world_size, on_metrics=metrics.append)
    return metrics, summary
