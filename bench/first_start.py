"""Submit -> first step of a small 2-rank job through the service, and where it went.

Starts `shardline serve` on its embedded defaults (SQLite, a local Ray head), submits the
same tiny dp=2 CPU job several times one after another, and prints one JSON line per run:
the seconds from submit until the API shows step 1, and the seconds from submit at which
each event was recorded. The first run of a fresh head also pays for Ray's first worker
processes; later runs are what a running service gives.

    .venv/bin/python -m bench.first_start [--runs 3] [--server-src DIR] [--label L]
        [--warm-workers N] [--settle-s S] [--gap-s G]

`--warm-workers N` sets the server's warm pool (SHARDLINE_WARM_WORKERS_PER_NODE; 0: none)
and `--settle-s S` waits that long after the server answers before the first job, so the
first job meets a warm service (its pool started); `--gap-s G` waits that long between
one job's end and the next submit (default 0: back to back). The last line is the runs' median and
max.

`--server-src DIR` serves another checkout's code (e.g. the code before a change) with
this one's client, so before and after run back to back in one command.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from shardline.api.client import TERMINAL_STATES, Client
from shardline.api.local_service import local_service

log = logging.getLogger(__name__)

JOB: dict[str, Any] = {
    "model": {"preset": "tiny", "seq_len": 32},
    "data": {"source": "synthetic"},
    "parallel": {"dp": 2},
    "train": {"steps": 3, "global_batch_size": 4, "micro_batch_size": 2},
}
POLL_S = 0.02


def _seconds(iso_time: str) -> float:
    return datetime.fromisoformat(iso_time).timestamp()


def run_to_end(
    client: Client,
    job_id: str,
    submitted: float,
    poll_s: float = POLL_S,
    then_poll_s: float | None = None,
) -> tuple[dict[str, Any], float | None]:
    """Poll the job until it ends: (the ended job, seconds from `submitted`, a
    time.monotonic() reading, until the API first showed step 1; None if it never did).
    Every `poll_s` until step 1 shows, then every `then_poll_s` (default `poll_s`)."""
    then = poll_s if then_poll_s is None else then_poll_s
    first_step_s = None
    while True:
        current = client.get(job_id)
        if first_step_s is None and current["step"] >= 1:
            first_step_s = time.monotonic() - submitted
        if current["state"] in TERMINAL_STATES:
            return current, first_step_s
        time.sleep(poll_s if first_step_s is None else then)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--server-src", type=Path, default=None)
    parser.add_argument("--label", default="")
    parser.add_argument("--warm-workers", type=int, default=None)
    parser.add_argument("--settle-s", type=float, default=0.0)
    parser.add_argument("--gap-s", type=float, default=0.0)
    args = parser.parse_args()
    if args.warm_workers is not None:  # the server's environment is this one's
        os.environ["SHARDLINE_WARM_WORKERS_PER_NODE"] = str(args.warm_workers)
    firsts: list[float] = []
    with (
        tempfile.TemporaryDirectory(prefix="shardline-first-start-") as state,
        local_service(Path(state), server_src=args.server_src) as svc,
        svc.client() as client,
    ):
        time.sleep(args.settle_s)
        for run in range(args.runs):
            if run:
                time.sleep(args.gap_s)
            submitted_at, submitted = time.time(), time.monotonic()
            job = client.submit({**JOB, "name": f"first-start-{run}"})
            current, first_step_s = run_to_end(client, job["id"], submitted)
            firsts.append(first_step_s or float("nan"))
            events = {
                e["message"][:60]: round(_seconds(e["time"]) - submitted_at, 2)
                for e in client.events(job["id"], after=0)
            }
            print(
                json.dumps(
                    {
                        "bench": "first_start",
                        "label": args.label,
                        "run": run,
                        "state": current["state"],
                        "submit_to_first_step_s": round(first_step_s or float("nan"), 2),
                        "events_at_s": events,
                    }
                ),
                flush=True,
            )
    summary = {"median_s": round(statistics.median(firsts), 2), "max_s": round(max(firsts), 2)}
    print(json.dumps({"bench": "first_start", "label": args.label, **summary}), flush=True)


if __name__ == "__main__":
    main()
