"""What one request (or a flood of them) costs the API: the hardening figures.

Starts the API as bench/api_load.py does (uvicorn, one process, no Ray: jobs stay QUEUED)
and prints one JSON line per measurement:

- `follow`: the server's peak resident memory while 8 clients follow one rank's log and
  100 MB are appended to it (the follow reads in bounded slices);
- `init_from`: the time and the server's peak memory for a submit whose `model.init_from`
  folder holds a 1 GiB (sparse) config.json (read at most 1 MiB, then refused);
- `bad_tokens`: /healthz p50 idle, then while `--clients` processes send requests with a bad token
  for `--flood-s` seconds (refused per address before any lookup), and what they got.

    .venv/bin/python -m bench.hardening [--flood-s 20]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil

from bench.api_load import start_server
from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.users import UserDirectory

FOLLOWERS = 8
LOG_BYTES = 100 << 20


def peak_rss_mb(pid: int, during: Callable[[], None]) -> float:
    """The process's peak resident memory (MB) while `during()` runs, sampled every 20 ms."""
    process, peak, done = psutil.Process(pid), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], process.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        during()
    finally:
        done.set()
        sampler.join()
    return peak[0] / 2**20


def follow(url: str, token: str, state: Path) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {token}"}
    job = httpx.post(f"{url}/v1/jobs", json={"name": "logs"}, headers=headers).json()
    log = state / "storage" / job["id"] / "logs" / "rank-0.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    got = [0] * FOLLOWERS

    def reader(i: int) -> None:
        with httpx.stream(
            "GET",
            f"{url}/v1/jobs/{job['id']}/logs",
            params={"follow": "true"},
            headers=headers,
            timeout=None,
        ) as response:
            for chunk in response.iter_bytes():
                got[i] += len(chunk)

    def append_and_wait() -> None:
        line = b"step 1234 loss 2.3456 lr 3e-4 tokens/s 123456 " * 2 + b"\n"
        with log.open("ab") as f:
            for _ in range(LOG_BYTES // len(line)):
                f.write(line)
        deadline = time.monotonic() + 120
        while min(got) < LOG_BYTES * 0.99 and time.monotonic() < deadline:
            time.sleep(0.1)

    readers = [threading.Thread(target=reader, args=(i,), daemon=True) for i in range(FOLLOWERS)]
    for r in readers:
        r.start()
    time.sleep(1.0)
    peak = peak_rss_mb(SERVER_PID[0], append_and_wait)
    httpx.post(f"{url}/v1/jobs/{job['id']}/cancel", headers=headers)
    for r in readers:
        r.join(timeout=30)
    return {
        "measure": "follow",
        "followers": FOLLOWERS,
        "appended_mb": LOG_BYTES / 2**20,
        "each_received_mb": round(min(got) / 2**20, 1),
        "server_peak_rss_mb": round(peak, 1),
    }


def init_from(url: str, token: str, data: Path) -> dict[str, Any]:
    folder = data / "huge-config"
    folder.mkdir(parents=True)
    with (folder / "config.json").open("wb") as f:
        f.truncate(1 << 30)
    answer: dict[str, Any] = {}

    def submit() -> None:
        started = time.monotonic()
        response = httpx.post(
            f"{url}/v1/jobs",
            json={"name": "huge", "model": {"init_from": str(folder)}},
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        )
        answer.update(status=response.status_code, seconds=time.monotonic() - started)

    peak = peak_rss_mb(SERVER_PID[0], submit)
    return {
        "measure": "init_from",
        "config_json_gb": 1,
        "status": answer["status"],
        "seconds": round(answer["seconds"], 3),
        "server_peak_rss_mb": round(peak, 1),
    }


def healthz_p50_ms(url: str, seconds: float) -> float:
    times = []
    with httpx.Client(base_url=url, timeout=10) as http:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            started = time.perf_counter()
            http.get("/healthz")
            times.append((time.perf_counter() - started) * 1000)
            time.sleep(0.01)
    return statistics.median(times)


def _flood(url: str, seconds: float, out: Any) -> None:
    """One client process: requests with a bad token, one after another, for `seconds`."""
    statuses: Counter[int] = Counter()
    deadline = time.monotonic() + seconds
    with httpx.Client(base_url=url, timeout=10) as http:
        while time.monotonic() < deadline:
            response = http.get("/v1/jobs", headers={"Authorization": "Bearer nope"})
            statuses[response.status_code] += 1
    out.put(dict(statuses))


def bad_tokens(url: str, flood_s: float, clients: int) -> dict[str, Any]:
    idle = healthz_p50_ms(url, 3.0)
    # Processes, not threads: the load generator must not slow this process's own
    # /healthz timing through the GIL.
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    flooders = [ctx.Process(target=_flood, args=(url, flood_s + 1.0, out)) for _ in range(clients)]
    for f in flooders:
        f.start()
    time.sleep(1.0)
    loaded = healthz_p50_ms(url, flood_s - 1.0)
    statuses: Counter[int] = Counter()
    for _ in flooders:
        statuses.update(out.get(timeout=60))
    for f in flooders:
        f.join()
    return {
        "measure": "bad_tokens",
        "flood_s": flood_s,
        "clients": clients,
        "requests": sum(statuses.values()),
        "statuses": dict(statuses),
        "healthz_p50_idle_ms": round(idle, 2),
        "healthz_p50_flooded_ms": round(loaded, 2),
        "ratio": round(loaded / idle, 2),
    }


SERVER_PID = [0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--flood-s", type=float, default=20.0)
    parser.add_argument("--clients", type=int, default=2, help="bad-token client processes")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="shardline-hardening-") as tmp:
        root = Path(tmp)
        url_db = f"sqlite:///{root / 'bench.db'}"
        upgrade_to_head(url_db)
        db = Database(url_db)
        users = UserDirectory(db)
        token = users.issue_token(users.ensure_user("bench"), "bench").token
        db.dispose()
        state, data = root / "state", root / "data"
        state.mkdir()
        data.mkdir()
        os.environ["SHARDLINE_DATA_ROOTS"] = str(data)  # the server's, through its env
        proc, url = start_server(url_db, state, None)
        SERVER_PID[0] = proc.pid
        try:
            print(json.dumps(follow(url, token, state)), flush=True)
            print(json.dumps(init_from(url, token, data)), flush=True)
            print(json.dumps(bad_tokens(url, args.flood_s, args.clients)), flush=True)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
