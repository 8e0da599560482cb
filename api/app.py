"""The FastAPI application, built by a factory so tests and `serve` build their own."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from shardline.api.auth_guard import FailedAuthGuard
from shardline.api.errors import install_error_handlers
from shardline.api.export_slots import ExportSlots
from shardline.api.limits import BodySizeLimit
from shardline.api.live_tokens import LiveTokens
from shardline.api.openapi import install_openapi
from shardline.api.options import install_options
from shardline.api.plan_turns import PlanTurns
from shardline.api.rate_limit import TokenBuckets
from shardline.api.routes import export, faults, jobs, logs, plan, profiles, queue, rates, system
from shardline.api.routes.docs import install_docs
from shardline.api.routes.pages import install_status_page
from shardline.api.telemetry import ApiTelemetry, TelemetryMiddleware
from shardline.service.admission import Admission
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.job_views import JobViews
from shardline.service.quotas import UserQuotas
from shardline.service.rates import Calibration, RatesBook
from shardline.service.read_cache import ReadCache
from shardline.service.runtime import NoRuntime, Runtime
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory
from shardline.service.write_notices import WriteListener

log = logging.getLogger(__name__)


def create_app(settings: Settings, runtime: Runtime | None = None) -> FastAPI:
    """The API over `settings.database_url` (already migrated); `runtime` runs the jobs."""
    db = Database(settings.resolved_database_url)
    the_runtime: Runtime = runtime or NoRuntime()
    read_cache = ReadCache(settings.read_cache_s, notified_ttl_s=settings.read_cache_notified_s)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        notices = WriteListener.for_database(db.url, read_cache)
        the_runtime.start()
        try:
            if notices is not None:
                notices.start()
            yield
        finally:
            the_runtime.stop()
            if notices is not None:  # it may be connecting: never on the event loop
                await asyncio.to_thread(notices.stop)
            await db.dispose_async()

    app = FastAPI(
        title="Shardline",
        version="0.1.0",
        lifespan=lifespan,
        description="Train large language models on your own cluster.",
        # FastAPI's own docs pages load their assets from CDNs; install_docs serves ours.
        docs_url=None,
        redoc_url=None,
    )
    settings.storage_limits.install()  # the checkpoint reads this process makes
    app.state.settings = settings
    app.state.db = db
    app.state.store = JobStore(db)
    app.state.views = JobViews(db)
    app.state.users = UserDirectory(db)
    app.state.runtime = the_runtime
    app.state.telemetry = ApiTelemetry(db)
    app.state.rate_limit = TokenBuckets(settings.rate_limit_per_s, settings.rate_limit_burst)
    app.state.read_cache = read_cache
    app.state.auth_failures = TokenBuckets(
        settings.auth_failures_per_s, settings.auth_failures_burst
    )
    app.state.live_tokens = LiveTokens(app.state.users.live_token_hashes)
    app.state.quotas = UserQuotas(db, settings)
    app.state.exports = ExportSlots()
    app.state.plan_turns = PlanTurns()
    app.state.rates = RatesBook(db)
    app.state.calibration = Calibration(
        app.state.rates, the_runtime.calibrate, the_runtime.share_rates
    )
    app.state.admission = Admission(
        settings, app.state.store, the_runtime, app.state.quotas, app.state.rates
    )
    install_error_handlers(app)
    install_options(app)
    install_openapi(app)
    app.add_middleware(TelemetryMiddleware, telemetry=app.state.telemetry)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    # Added last, so it runs first: an address over its failed-authentication limit is
    # answered before the rest of the stack does any work.
    app.add_middleware(
        FailedAuthGuard, failures=app.state.auth_failures, live=app.state.live_tokens
    )
    app.include_router(jobs.router)
    app.include_router(logs.router)
    app.include_router(faults.router)
    app.include_router(profiles.router)
    app.include_router(export.router)
    app.include_router(system.router)
    app.include_router(queue.router)
    app.include_router(plan.router)
    app.include_router(rates.router)
    install_openapi(app)
    install_docs(app)
    install_status_page(app)
    return app
