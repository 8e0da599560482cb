"""The plan against measurement: layouts of one model run here, then compared; one JSON line.

    .venv/bin/python -m bench.plan_accuracy [SPEC.yaml] [--layouts "dp=4" "pp=2,tp=2" ...]

Rates are calibrated first, in this run (`shardline plan --calibrate`'s measurement); then
each layout trains with `shardline train`'s launcher (bench.layouts) and is predicted by
the cost model. Printed: per layout the predicted and measured step time, peak memory and
model-state bytes; and over all of them the ranking agreement (Spearman), the mean step
error, the largest memory errors, and the regret of the plan's first choice (its measured
step over the fastest measured step).
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any

from bench.layouts import layout_spec, run_layout
from shardline.workers.contract.cost_model import predict
from shardline.workers.contract.spec import JobSpec, load_spec
from shardline.workers.engine.calibrate import calibrate

# On 4 ranks: data, tensor and pipeline parallel, ZeRO stages, schedules, SP.
LAYOUTS = [
    "dp=4",
    "dp=4,zero=2",
    "dp=4,zero=3",
    "dp=2,tp=2",
    "dp=2,tp=2,zero=3",
    "dp=2,tp=2,sp=1",
    "pp=2,dp=2",
    "pp=2,dp=2,sched=gpipe",
    "pp=2,tp=2",
    "pp=4",
]
DEFAULT_SPEC = {
    "name": "plan-accuracy",
    "model": {"preset": "tiny", "dim": 256, "n_heads": 8, "n_kv_heads": 4, "seq_len": 128},
    "data": {"source": "synthetic"},
    "train": {"steps": 12, "global_batch_size": 16, "micro_batch_size": 2, "log_every": 1},
}


def ranks_of(values: list[float]) -> list[float]:
    """1-based ranks, ties given their mean rank."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks_of(a), ranks_of(b)
    n = len(a)
    mean = (n + 1) / 2
    cov = sum((x - mean) * (y - mean) for x, y in zip(ra, rb, strict=True))
    var_a = sum((x - mean) ** 2 for x in ra)
    var_b = sum((y - mean) ** 2 for y in rb)
    return cov / (var_a * var_b) ** 0.5 if var_a and var_b else float("nan")


def compare(base: JobSpec, layouts: list[str]) -> dict[str, Any]:
    ranks = layout_spec(base, layouts[0]).parallel.world_size
    rates = calibrate(base, ranks)
    rows = []
    for layout in layouts:
        spec = layout_spec(base, layout)
        predicted = predict(spec, rates)
        measured = run_layout(base, layout)
        rows.append(
            {
                "asked": layout,
                "layout": measured["layout"],
                "step_s": [round(predicted.step_s, 4), measured["step_time_s"]],
                "peak_bytes": [predicted.peak_bytes_per_rank, measured["peak_mem_bytes"]],
                "model_state_bytes": [
                    predicted.model_state_bytes_per_rank,
                    measured["model_state_bytes"],
                ],
            }
        )

    def error(key: str, i: int) -> float:
        predicted, measured = rows[i][key]
        return abs(predicted - measured) / measured

    steps_predicted = [r["step_s"][0] for r in rows]
    steps_measured = [r["step_s"][1] for r in rows]
    first = min(range(len(rows)), key=lambda i: steps_predicted[i])
    return {
        "bench": "plan_accuracy",
        "rates": rates.to_json(),
        "layouts": rows,
        "spearman": spearman(steps_predicted, steps_measured),
        "mean_step_error": sum(error("step_s", i) for i in range(len(rows))) / len(rows),
        "max_model_state_error": max(error("model_state_bytes", i) for i in range(len(rows))),
        "max_peak_error": max(error("peak_bytes", i) for i in range(len(rows))),
        "regret": steps_measured[first] / min(steps_measured),
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", type=Path)
    parser.add_argument("--layouts", nargs="+", default=LAYOUTS)
    args = parser.parse_args()
    base = load_spec(args.spec) if args.spec else JobSpec.model_validate(DEFAULT_SPEC)
    print(json.dumps(compare(base, args.layouts)), flush=True)


if __name__ == "__main__":
    main()
