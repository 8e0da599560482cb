"""Named dependencies, so every route reads the same way and none forgets auth."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.auth_guard import refusal_message
from api.errors import ApiError
from api.rate_limit import TokenBuckets, retry_after_header
from service.config import Settings
from service.job_views import JobViews
from service.principal import Principal
from service.runtime import Runtime
from service.store import JobStore
from service.users import UserDirectory, hash_token

# Dependencies that only read app.state are `async def`: FastAPI runs a plain `def` one in
# the thread pool, a hop per dependency per request for nothing.
_bearer = HTTPBearer(auto_error=False, description="An API token: `shardline token create`")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> JobStore:
    return request.app.state.store


async def get_views(request: Request) -> JobViews:
    return request.app.state.views


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_current_user(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> Principal:
    challenge = {"WWW-Authenticate": "Bearer"}
    # Failed authentications are limited per address before any lookup: a flood of bad
    # tokens is answered by api/auth_guard.py before routing; this check holds for a route
    # outside its prefixes, with no database read either.
    failures: TokenBuckets = request.app.state.auth_failures
    address = request.client.host if request.client else "unknown"
    if (wait_s := failures.wait(address)) > 0:
        raise ApiError(
            429, "rate_limited", refusal_message(address), headers=retry_after_header(wait_s)
        )
    if credentials is None:
        failures.take(address)
        raise ApiError(401, "unauthorized", "missing bearer token", headers=challenge)
    users: UserDirectory = request.app.state.users
    token_hash = hash_token(credentials.credentials)
    user = await run_in_threadpool(users.authenticate_hash, token_hash)
    if user is None:
        failures.take(address)
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=challenge)
    limiter: TokenBuckets = request.app.state.rate_limit
    wait_s = limiter.take(token_hash)
    if wait_s > 0:
        raise ApiError(
            429,
            "rate_limited",
            f"more than {limiter.rate_per_s:g} requests per second (bursts of "
            f"{limiter.burst:g}) with this token; retry after the Retry-After seconds "
            "(the server's limit is SHARDLINE_RATE_LIMIT_PER_S and SHARDLINE_RATE_LIMIT_BURST)",
            {"limit_per_s": limiter.rate_per_s, "burst": limiter.burst},
            headers=retry_after_header(wait_s),
        )
    return user


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[JobStore, Depends(get_store)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
CurrentUser = Annotated[Principal, Depends(get_current_user)]
ViewsDep = Annotated[JobViews, Depends(get_views)]
