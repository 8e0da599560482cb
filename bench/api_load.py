"""API throughput and latency under N concurrent clients, route by route.

Starts the API (uvicorn, one process, no Ray: jobs stay QUEUED) over a fresh database,
seeds jobs and metrics, then for each route runs N concurrent connections for a fixed time
(spread over client processes, so the load generator is not one busy core) and prints one
JSON line per route: requests/s, p50/p99 latency, errors, and the ratio to `/healthz`
measured in the same run (the framework's ceiling on this machine).

    .venv/bin/python -m bench.api_load [--database-url URL] [--connections 32]
        [--duration-s 10] [--server-src DIR] [--routes status,list]
        [--loop auto|asyncio|uvloop] [--http auto|h11|httptools]

`--database-url` names an empty database (PostgreSQL) to migrate and use; the default is
a SQLite file in a temporary folder. `--server-src DIR` serves the API from another
checkout (e.g. the code before a change) with this one's load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from shardline.service.db import Database
from shardline.service.migrate import upgrade_to_head
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.workers.contract.net import free_port
from shardline.workers.contract.progress import MetricsEntry
from shardline.workers.contract.spec import JobSpec

log = logging.getLogger(__name__)

ROUTES = ("healthz", "status", "list", "metrics", "submit")
SEEDED_JOBS = 200
SEEDED_STEPS = 50
SERVER = (
    "import uvicorn\n"
    "from shardline.api.app import create_app\n"
    "from shardline.service.config import Settings\n"
    "settings = Settings()\n"
    "import os\n"
    "uvicorn.run(create_app(settings), host='127.0.0.1', port=settings.port,"
    " log_level='warning', loop=os.environ.get('BENCH_LOOP', 'auto'),"
    " http=os.environ.get('BENCH_HTTP', 'auto'))\n"
)


@dataclass(frozen=True)
class Target:
    url: str
    server_pid: int
    tokens: list[str]
    job_ids: list[str]


def seed(database_url: str, users: int) -> tuple[list[str], list[str]]:
    """Migrate, make one user and token per connection, and jobs with metrics to read."""
    upgrade_to_head(database_url)
    db = Database(database_url)
    directory, store = UserDirectory(db), JobStore(db)
    tokens, job_ids = [], []
    owner = directory.ensure_user("bench")
    for i in range(users):
        tokens.append(directory.issue_token(owner, f"bench-{i}").token)
    for i in range(SEEDED_JOBS):
        job, _ = store.create(owner, JobSpec.model_validate({"name": f"seed-{i}"}))
        job_ids.append(job.id)
    for job_id in job_ids[:10]:
        entries = [
            MetricsEntry(seq=s, step=s, values={"step": s, "loss": 1.0})
            for s in range(1, SEEDED_STEPS + 1)
        ]
        store.record_progress(job_id, entries, after_seq=0)
    db.dispose()
    return tokens, job_ids


def request_for(route: str, target: Target, rng: random.Random, n: int) -> tuple[str, str, Any]:
    """(method, path, json body) of one request to `route`."""
    if route == "healthz":
        return "GET", "/healthz", None
    if route == "status":
        return "GET", f"/v1/jobs/{rng.choice(target.job_ids)}", None
    if route == "list":
        return "GET", "/v1/jobs?limit=20", None
    if route == "metrics":
        return "GET", f"/v1/jobs/{rng.choice(target.job_ids[:10])}/metrics", None
    return "POST", "/v1/jobs", {"name": f"load-{n}"}


async def _connection(
    route: str, target: Target, token: str, until: float, seed_: int
) -> tuple[list[float], int]:
    rng, latencies, errors = random.Random(seed_), [], 0
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=target.url, headers=headers, timeout=30) as http:
        n = 0
        while time.monotonic() < until:
            method, path, body = request_for(route, target, rng, seed_ * 1_000_000 + n)
            started = time.perf_counter()
            try:
                response = await http.request(method, path, json=body)
                ok = response.status_code < 400
            except httpx.HTTPError:
                ok = False
            latencies.append(time.perf_counter() - started)
            errors += not ok
            n += 1
    return latencies, errors


def _client_process(args: tuple[str, Target, list[str], float, int]) -> tuple[list[float], int]:
    route, target, tokens, until, first = args

    async def run() -> tuple[list[float], int]:
        results = await asyncio.gather(
            *(_connection(route, target, t, until, first + i) for i, t in enumerate(tokens))
        )
        return [x for lat, _ in results for x in lat], sum(e for _, e in results)

    return asyncio.run(run())


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time of a process so far (Linux), None elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(
    route: str, target: Target, connections: int, duration_s: float, processes: int
) -> dict[str, Any]:
    """N connections on one route for `duration_s` (after a one-second warm-up)."""
    _client_process((route, target, target.tokens[:1], time.monotonic() + 1.0, 0))
    cpu_before = cpu_seconds(target.server_pid)
    until = time.monotonic() + duration_s
    shares = [target.tokens[p:connections:processes] for p in range(processes)]
    jobs = [(route, target, share, until, 1 + p * 1000) for p, share in enumerate(shares)]
    with multiprocessing.get_context("fork").Pool(processes) as pool:
        results = pool.map(_client_process, jobs)
    latencies = sorted(x for lat, _ in results for x in lat)
    errors = sum(e for _, e in results)
    cpu_after = cpu_seconds(target.server_pid)
    # The server's CPU time per request: what a route costs, whatever else the machine
    # runs at the same time (requests/s and latency depend on that load too).
    cpu_ms = (
        round((cpu_after - cpu_before) * 1000 / len(latencies), 2)
        if cpu_before is not None and cpu_after is not None and latencies
        else None
    )

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000

    return {
        "route": route,
        "requests": len(latencies),
        "rps": round(len(latencies) / duration_s, 1),
        "p50_ms": round(pct(0.50), 2),
        "p99_ms": round(pct(0.99), 2),
        "errors": errors,
        "server_cpu_ms_per_request": cpu_ms,
    }


def start_server(
    database_url: str, state_dir: Path, server_src: Path | None
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "SHARDLINE_DATABASE_URL": database_url,
        "SHARDLINE_STATE_DIR": str(state_dir),
        "SHARDLINE_PORT": str(port),
        # Every client is a token of its own, far below the default limit; the bench
        # measures the API, not the limiter refusing it.
        "SHARDLINE_USER_MAX_QUEUED_JOBS": "0",
    }
    if server_src is not None:
        env["PYTHONPATH"] = f"{server_src}{os.pathsep}{env.get('PYTHONPATH', '')}"
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        env=env,
        cwd=server_src or Path.cwd(),
        stdout=subprocess.DEVNULL,
        stderr=(state_dir / "server.log").open("ab"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the API did not start; see {state_dir / 'server.log'}")
        time.sleep(0.2)


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--database-url", default="")
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--duration-s", type=float, default=10.0)
    parser.add_argument("--client-processes", type=int, default=2)
    parser.add_argument("--server-src", type=Path, default=None)
    parser.add_argument("--label", default="", help="added to every line, e.g. before/after")
    # uvicorn's event loop and HTTP parser: "auto" takes uvloop and httptools where they
    # are installed; "asyncio" and "h11" are the pure-Python ones.
    parser.add_argument("--loop", default="auto", choices=["auto", "asyncio", "uvloop"])
    parser.add_argument("--http", default="auto", choices=["auto", "h11", "httptools"])
    parser.add_argument(
        "--routes",
        default=",".join(ROUTES),
        help=f"comma-separated, from {', '.join(ROUTES)}; healthz is always measured first",
    )
    args = parser.parse_args()
    asked = [r for r in args.routes.split(",") if r]
    unknown = sorted(set(asked) - set(ROUTES))
    if unknown:
        parser.error(f"unknown route(s) {', '.join(unknown)}; choose from {', '.join(ROUTES)}")
    # /healthz first: every other route is reported as a ratio to it.
    routes = ["healthz", *(r for r in asked if r != "healthz")]
    with tempfile.TemporaryDirectory(prefix="shardline-api-load-") as tmp:
        state_dir = Path(tmp)
        url = args.database_url or f"sqlite:///{state_dir / 'shardline.db'}"
        tokens, job_ids = seed(url, args.connections)
        os.environ["BENCH_LOOP"], os.environ["BENCH_HTTP"] = args.loop, args.http
        proc, server_url = start_server(url, state_dir, args.server_src)
        try:
            target = Target(server_url, proc.pid, tokens, job_ids)
            ceiling = None
            for route in routes:
                row = measure(
                    route, target, args.connections, args.duration_s, args.client_processes
                )
                ceiling = ceiling or row["rps"]
                print(
                    json.dumps(
                        {
                            "bench": "api_load",
                            "label": args.label,
                            "database": url.split(":", 1)[0].split("+", 1)[0],
                            "connections": args.connections,
                            "duration_s": args.duration_s,
                            **row,
                            "vs_healthz": round(row["rps"] / ceiling, 2),
                        }
                    ),
                    flush=True,
                )
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
