"""Prometheus metrics of the API: requests, latencies, and jobs by state."""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardline.service.db import Database
from shardline.service.models import Job, JobEvent
from shardline.workers.contract.events import EventKind
from shardline.workers.contract.lifecycle import JobState

# Label values come from this fixed set, so no request can add a series: a made-up method
# is "other" and a path that matches no route is "unmatched".
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


class JobsByState(Collector):
    """Counted at scrape time from the database, the only source of truth."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily("shardline_jobs", "Jobs by state", labels=["state"])
        with self.db.session() as s:
            counts = dict(s.execute(select(Job.state, func.count()).group_by(Job.state)).all())
        for state in JobState:
            gauge.add_metric([state.value], counts.get(state.value, 0))
        yield gauge


# Submit -> first step, in seconds: the start a user waits for (S2 aims at 2 s).
FIRST_STEP_BUCKETS = (1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
# The newest jobs' first steps only: a scrape reads a bounded number of events.
FIRST_STEP_JOBS = 1000


class FirstSteps(Collector):
    """Seconds from submit to the end of the first step of the newest jobs that trained,
    as a histogram, read at scrape time from their `first_step` events."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[HistogramMetricFamily]:
        query = (
            select(JobEvent.data)
            .where(JobEvent.data["kind"].as_string() == EventKind.FIRST_STEP.value)
            .order_by(JobEvent.id.desc())
            .limit(FIRST_STEP_JOBS)
        )
        with self.db.reader() as conn:
            seconds = [float(d["seconds"]) for d in conn.scalars(query) if d and "seconds" in d]
        buckets = [
            (str(bound), sum(1 for v in seconds if v <= bound)) for bound in FIRST_STEP_BUCKETS
        ]
        yield HistogramMetricFamily(
            "shardline_first_step_seconds",
            f"Seconds from submit to the end of the first step (the newest {FIRST_STEP_JOBS} jobs)",
            buckets=[*buckets, ("+Inf", len(seconds))],
            sum_value=sum(seconds),
        )


class ApiTelemetry:
    def __init__(self, db: Database) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "shardline_http_requests",
            "HTTP requests",
            ["method", "route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "shardline_http_request_seconds",
            "HTTP request latency",
            ["method", "route"],
            registry=self.registry,
        )
        self.registry.register(JobsByState(db))
        self.registry.register(FirstSteps(db))

    def observe(self, method: str, route: str, status: int, seconds: float) -> None:
        method = method if method in KNOWN_METHODS else "other"
        self.requests.labels(method, route, str(status)).inc()
        self.latency.labels(method, route).observe(seconds)


class TelemetryMiddleware:
    """Pure ASGI middleware that counts every request: Starlette's BaseHTTPMiddleware
    (`app.middleware("http")`) runs each request through an extra task and stream, a
    fixed cost on every route."""

    def __init__(self, app: ASGIApp, telemetry: ApiTelemetry) -> None:
        self.app, self.telemetry = app, telemetry

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500  # what the client gets if nothing answers

        async def counting_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            # The router records the matched route in the scope it was given.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.telemetry.observe(scope["method"], route, status, time.perf_counter() - start)
