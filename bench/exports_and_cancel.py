"""Exports while a job trains under `keep_last: 1`, and a cancel while a big job starts:
the two hardening figures that need a cluster.

Starts `shardline serve` on its embedded defaults (SQLite, a local Ray head) and prints one
JSON line per measurement:

- `exports`: a dp=2 job checkpoints every 2 steps keeping 1; once it has a checkpoint,
  `--exports` clients each export its newest checkpoint at once (two run, the rest queue),
  while `/healthz` is timed every 50 ms. Every export's status and size, the healthz
  latencies (p50, max), and each worker process's memory (rss, uss; with its warm spares).
- `cancel`: a job of `--ranks` ranks at 0.1 CPU each (warm spares off) is submitted, and
  cancelled as soon as it is STARTING; the seconds from the cancel to CANCELLED, and
  whether any of its actors was left. The server's core-share minimum is lowered for it
  (`SHARDLINE_MIN_CORE_SHARE`), since by default such a job is refused at submit.

    .venv/bin/python -m bench.exports_and_cancel [--exports 10] [--ranks 40]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from shardline.api.client import TERMINAL_STATES, Client
from shardline.api.local_service import LocalService, local_service

log = logging.getLogger(__name__)


def _job(name: str, dp: int, steps: int, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "model": {"preset": "tiny", "seq_len": 32},
        "data": {"source": "synthetic"},
        "parallel": {"dp": dp},
        "train": {"steps": steps, "global_batch_size": dp, "micro_batch_size": 1},
        **extra,
    }


def _wait(client: Client, job_id: str, done: Any, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        job = client.get(job_id)
        if done(job):
            return job
        if time.monotonic() > deadline:
            raise TimeoutError(f"job {job_id} is {job['state']} after {timeout_s:.0f}s")
        time.sleep(0.05)


def exports(svc: LocalService, client: Client, count: int) -> dict[str, Any]:
    job = client.submit(_job("exports", 2, 100_000, checkpoint={"every_steps": 2, "keep_last": 1}))
    _wait(client, job["id"], lambda j: bool(client.checkpoints(j["id"])), 300)
    headers = {"Authorization": f"Bearer {svc.token}"}
    results: list[dict[str, Any]] = [{} for _ in range(count)]
    # The timer in a process of its own: the export clients' threads here would hold this
    # process's GIL while they read their archives, and delay its timing.
    ctx = multiprocessing.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    timer = ctx.Process(target=time_healthz, args=(svc.url, stop, out))
    timer.start()

    def export(i: int) -> None:
        started = time.monotonic()
        with httpx.Client(base_url=svc.url, headers=headers, timeout=600) as http:
            response = http.get(f"/v1/jobs/{job['id']}/export")
        results[i] = {
            "status": response.status_code,
            "bytes": len(response.content),
            "s": round(time.monotonic() - started, 2),
            **({"error": response.json()["error"]["code"]} if response.status_code >= 400 else {}),
        }

    clients = [threading.Thread(target=export, args=(i,)) for i in range(count)]
    for t in clients:
        t.start()
    for t in clients:
        t.join()
    stop.set()
    healthz_ms: list[float] = out.get(timeout=60)
    timer.join()
    trained = client.get(job["id"])
    workers = worker_memory_mb()
    client.cancel(job["id"])
    _wait(client, job["id"], lambda j: j["state"] in TERMINAL_STATES, 120)
    return {
        "measure": "exports",
        "exports": count,
        "statuses": sorted(r["status"] for r in results),
        "export_s": [r["s"] for r in results],
        "min_bytes": min(r["bytes"] for r in results),
        "job_state_during": trained["state"],
        "job_step_after": trained["step"],
        "healthz_p50_ms": round(statistics.median(healthz_ms), 2),
        "healthz_p99_ms": round(statistics.quantiles(healthz_ms, n=100)[98], 2),
        "healthz_max_ms": round(max(healthz_ms), 2),
        "healthz_over_100ms": sum(ms > 100 for ms in healthz_ms),
        "healthz_samples": len(healthz_ms),
        # What demand.PROCESS_BYTES stands for: each training rank's process (and its
        # warm spare's), resident and unique.
        "worker_processes": workers,
    }


def worker_memory_mb() -> list[dict[str, Any]]:
    """Resident and unique (USS) memory of every Ray TrainingWorker process, in MiB."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if cmd.startswith("ray::TrainingWorker"):
            with contextlib.suppress(psutil.Error):
                mem = proc.memory_full_info()
                found.append({"rss": round(mem.rss / 2**20), "uss": round(mem.uss / 2**20)})
    return found


def time_healthz(url: str, stop: Any, out: Any) -> None:
    """GET /healthz every 50 ms until `stop`; the latencies (ms) go to `out`."""
    times: list[float] = []
    with httpx.Client(base_url=url, timeout=30) as http:
        while not stop.is_set():
            started = time.perf_counter()
            http.get("/healthz")
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.05)
    out.put(times)


def cancel(client: Client, ranks: int) -> dict[str, Any]:
    spec = _job(
        "big-cancel",
        ranks,
        10,
        resources={"cpus_per_worker": 0.1},
        fault_tolerance={"warm_spares": False},
    )
    job = client.submit(spec)
    _wait(client, job["id"], lambda j: j["state"] != "QUEUED", 120)
    time.sleep(1.0)  # well into starting its workers
    during = client.get(job["id"])["state"]
    started = time.monotonic()
    client.cancel(job["id"])
    ended = _wait(client, job["id"], lambda j: j["state"] in TERMINAL_STATES, 300)
    return {
        "measure": "cancel",
        "ranks": ranks,
        "state_when_cancelled": during,
        "final_state": ended["state"],
        "cancel_to_end_s": round(time.monotonic() - started, 2),
    }


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--exports", type=int, default=10)
    parser.add_argument("--ranks", type=int, default=40)
    args = parser.parse_args()
    # 0.1 CPU x 40 ranks is 4 of the head's 8 logical CPUs; 40 ranks on a small host would
    # be refused for crowding its cores, which is not what this measures.
    os.environ["SHARDLINE_MIN_CORE_SHARE"] = "0.01"
    with (
        tempfile.TemporaryDirectory(prefix="shardline-exports-") as state,
        local_service(Path(state)) as svc,
        svc.client() as client,
    ):
        print(json.dumps(exports(svc, client, args.exports)), flush=True)
        print(json.dumps(cancel(client, args.ranks)), flush=True)


if __name__ == "__main__":
    main()
