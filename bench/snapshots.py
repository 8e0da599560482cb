"""What in-memory snapshots cost a step, in one run; one JSON line.

    .venv/bin/python -m bench.snapshots [--steps 60] [--nproc 2] [--every 1]

Trains the same spec (tiny model, dp=nproc, zero-2) four times with `shardline train`'s
launcher: without snapshots, and with a snapshot into /dev/shm every `--every` step(s),
every 5 steps, and at the default cadence ("auto": as often as costs at most 2% of the
step). A snapshot's cost lands between steps (the copy into host buffers, and the wait
for the previous one's write), outside the step time the trainer reports, so the figure
compared is the wall-clock interval between consecutive steps as rank 0 reports them,
over the steps after the first five: the median for snapshots every step or five, the
mean for "auto" (its snapshots are rarer than half the steps, so a median hides them).
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from itertools import pairwise
from pathlib import Path
from statistics import mean, median
from typing import Any

from shardline.workers.contract.spec import JobSpec
from shardline.workers.engine.launch import LocalCheckpoints, train_local
from shardline.workers.storage.snapshots import default_snapshot_root


def spec(steps: int, nproc: int, every: int | str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "bench-snapshots",
            "model": {"preset": "tiny", "seq_len": 64},
            "parallel": {"dp": nproc, "zero_stage": 2},
            "train": {
                "steps": steps,
                "global_batch_size": 4 * nproc,
                "micro_batch_size": 2,
                "log_every": 1,
            },
            "checkpoint": {"memory_every_steps": every},
        }
    )


def step_interval(steps: int, nproc: int, every: int | str) -> dict[str, Any]:
    """Median and mean seconds from one step's metrics to the next's, the snapshot bytes
    and the steps snapshots were taken after."""
    root = default_snapshot_root()
    root.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="bench-", dir=root))
    arrivals: list[float] = []
    held: list[float] = []
    taken: list[int] = []

    def seen(metrics: dict[str, Any]) -> None:
        arrivals.append(time.perf_counter())
        if "snapshot_blocking_s" in metrics:
            held.append(metrics["snapshot_blocking_s"])
            taken.append(int(metrics["step"]))

    try:
        local = LocalCheckpoints(snapshot_folder=str(folder) if every else None)
        train_local(spec(steps, nproc, every), nproc, on_metrics=seen, local=local)
        size = sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    intervals = [b - a for a, b in pairwise(arrivals[5:])]
    return {
        "interval_s": round(median(intervals), 4),
        "mean_interval_s": round(mean(intervals), 4),
        "taken": taken,
        "held_s": round(median(held), 4) if held else 0.0,
        "snapshot_bytes": size,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--every", type=int, default=1)
    args = parser.parse_args()
    off = step_interval(args.steps, args.nproc, 0)
    each = step_interval(args.steps, args.nproc, args.every)
    five = step_interval(args.steps, args.nproc, 5)
    auto = step_interval(args.steps, args.nproc, "auto")
    result = {
        "nproc": args.nproc,
        "steps": args.steps,
        "interval_s_off": off["interval_s"],
        f"interval_s_every_{args.every}": each["interval_s"],
        "interval_s_every_5": five["interval_s"],
        f"overhead_every_{args.every}": round(each["interval_s"] / off["interval_s"] - 1, 4),
        "overhead_every_5": round(five["interval_s"] / off["interval_s"] - 1, 4),
        "overhead_auto": round(auto["mean_interval_s"] / off["mean_interval_s"] - 1, 4),
        "auto_taken_after": auto["taken"],
        "held_s_per_snapshot": each["held_s"],
        "snapshot_bytes": each["snapshot_bytes"],
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
