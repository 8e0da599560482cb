"""How long a local run takes to start its ranks: spawn (each rank imports torch and the
engine) against the fork server (`workers.engine.launch.rank_processes`, which imported
them once), alternating in one run; the tiny model, 10 steps, the median of 3 each.

    OMP_NUM_THREADS=1 .venv/bin/python -m bench.local_ranks
"""

from __future__ import annotations

import json
import multiprocessing as mp
import statistics
import time
from typing import Any

import shardline.workers.engine.launch as launch
from shardline.workers.contract.spec import JobSpec


def spec(parallel: dict[str, Any]) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "local-ranks",
            "model": {"preset": "tiny", "seq_len": 64},
            "parallel": parallel,
            "train": {"steps": 10, "global_batch_size": 8, "micro_batch_size": 2},
        }
    )


def timed(parallel: dict[str, Any]) -> float:
    started = time.perf_counter()
    launch.train_local(spec(parallel), spec(parallel).parallel.world_size)
    return time.perf_counter() - started


def main() -> None:
    forkserver = launch.rank_processes
    contexts = {"spawn": lambda: mp.get_context("spawn"), "forkserver": forkserver}
    timed({"dp": 2})  # the fork server starts once per process: not in the timings
    for parallel in ({"dp": 2}, {"dp": 2, "tp": 2, "zero_stage": 1}):
        got: dict[str, list[float]] = {name: [] for name in contexts}
        for _ in range(3):
            for name, context in contexts.items():
                launch.rank_processes = context
                got[name].append(timed(parallel))
        spawn, fork = statistics.median(got["spawn"]), statistics.median(got["forkserver"])
        print(
            json.dumps(
                {
                    "parallel": parallel,
                    "spawn_s": round(spawn, 2),
                    "forkserver_s": round(fork, 2),
                    "ratio": round(spawn / fork, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
