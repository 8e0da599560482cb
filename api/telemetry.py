"""Prometheus metrics of the API: requests, latencies, and jobs by state."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator

from fastapi import Request, Response
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select

from service.db import Database
from service.models import Job
from workers.lifecycle import JobState

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

    async def middleware(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        start = time.perf_counter()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        method = request.method if request.method in KNOWN_METHODS else "other"
        self.requests.labels(method, route, str(response.status_code)).inc()
        self.latency.labels(method, route).observe(time.perf_counter() - start)
        return response
