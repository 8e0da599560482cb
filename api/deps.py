"""Named dependencies, so every route reads the same way and none forgets auth."""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Annotated, Generic, TypeVar

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from shardline.api.auth_guard import refusal_message
from shardline.api.errors import ApiError
from shardline.api.export_slots import ExportSlots
from shardline.api.rate_limit import TokenBuckets, retry_after_header
from shardline.api.telemetry import ApiTelemetry
from shardline.service.admission import Admission
from shardline.service.config import Settings
from shardline.service.db import Database
from shardline.service.job_views import JobViews
from shardline.service.principal import Principal
from shardline.service.rates import Calibration, RatesBook
from shardline.service.read_cache import ReadCache, commits
from shardline.service.runtime import Runtime
from shardline.service.store import JobStore
from shardline.service.users import UserDirectory, hash_token

T = TypeVar("T")

# Dependencies that only read app.state are `async def`: FastAPI runs a plain `def` one in
# the thread pool, a hop per dependency per request for nothing.
_bearer = HTTPBearer(auto_error=False, description="An API token: `shardline token create`")


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_store(request: Request) -> JobStore:
    return request.app.state.store


async def get_runtime(request: Request) -> Runtime:
    return request.app.state.runtime


async def get_admission(request: Request) -> Admission:
    return request.app.state.admission


async def get_rates(request: Request) -> RatesBook:
    return request.app.state.rates


async def get_calibration(request: Request) -> Calibration:
    return request.app.state.calibration


async def get_database(request: Request) -> Database:
    return request.app.state.db


async def get_telemetry(request: Request) -> ApiTelemetry:
    return request.app.state.telemetry


async def get_exports(request: Request) -> ExportSlots:
    return request.app.state.exports


@dataclass(frozen=True, slots=True)
class Caller:
    """A request's bearer token, not yet looked up: what `read_as` authenticates in the
    same thread-pool call and on the same connection as the read it makes."""

    token_hash: str
    address: str


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def caller_of(request: Request, credentials: HTTPAuthorizationCredentials | None) -> Caller:
    """The request's bearer token, or its 401 (429 for an address over its limit)."""
    # Failed authentications are limited per address before any lookup: a flood of bad
    # tokens is answered by api/auth_guard.py before routing; this check holds for a route
    # outside its prefixes, with no database read either.
    # A live token goes on from an address over its limit (the guard has read the live
    # set where it needed to).
    failures: TokenBuckets = request.app.state.auth_failures
    address = request.client.host if request.client else "unknown"
    token_hash = hash_token(credentials.credentials) if credentials is not None else None
    if (
        wait_s := failures.wait(address)
    ) > 0 and token_hash not in request.app.state.live_tokens.hashes:
        raise ApiError(
            429, "rate_limited", refusal_message(address), headers=retry_after_header(wait_s)
        )
    if token_hash is None:
        failures.take(address)
        raise ApiError(401, "unauthorized", "missing bearer token", headers=_CHALLENGE)
    return Caller(token_hash, address)


# The polled reads take the bearer credentials as their one dependency and look the token
# up inside `read_as`: each dependency FastAPI solves costs a sixth of such a read.
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


async def get_caller(request: Request, credentials: BearerDep) -> Caller:
    return caller_of(request, credentials)


def _admit(request: Request, caller: Caller, user: Principal | None) -> Principal:
    """`user` (the token's owner, None for an unknown or revoked token) if the request may
    go on: a 401 counted against the address, or a 429 past the token's rate limit."""
    if user is None:
        request.app.state.auth_failures.take(caller.address)
        raise ApiError(401, "unauthorized", "invalid or revoked token", headers=_CHALLENGE)
    limiter: TokenBuckets = request.app.state.rate_limit
    wait_s = limiter.take(caller.token_hash)
    if wait_s > 0:
        raise _over_rate_limit(limiter, wait_s)
    return user


def _over_rate_limit(limiter: TokenBuckets, wait_s: float) -> ApiError:
    return ApiError(
        429,
        "rate_limited",
        f"more than {limiter.rate_per_s:g} requests per second (bursts of "
        f"{limiter.burst:g}) with this token; retry after the Retry-After seconds "
        "(the server's limit is SHARDLINE_RATE_LIMIT_PER_S and SHARDLINE_RATE_LIMIT_BURST)",
        {"limit_per_s": limiter.rate_per_s, "burst": limiter.burst},
        headers=retry_after_header(wait_s),
    )


async def get_current_user(
    request: Request, caller: Annotated[Caller, Depends(get_caller)]
) -> Principal:
    users: UserDirectory = request.app.state.users
    cache: ReadCache = request.app.state.read_cache
    user = cache.get(_token_key(caller.token_hash))
    if user is None:
        generation = commits()
        user = await run_in_threadpool(users.authenticate_hash, caller.token_hash)
        if user is not None:
            cache.put(_token_key(caller.token_hash), user, generation)
    return _admit(request, caller, user)


def _token_key(token_hash: str) -> tuple[str, str]:
    return ("token", token_hash)


@dataclass(frozen=True, slots=True)
class Keep(Generic[T]):
    """How a polled read's answer is kept in the read cache (service/read_cache.py): under
    `key(user)`, given again to a user only where `visible(user, answer)` (else read
    again, and the read gives its 404)."""

    key: Callable[[Principal], Hashable]
    visible: Callable[[Principal, T], bool] = lambda _user, _answer: True


async def read_as(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    read: Callable[[Principal], T],
    *,
    few_rows: bool = False,
    keep: Keep[T] | None = None,
) -> T:
    """`read(user)` for the caller's user, authenticated in the same call and on the same
    pooled connection as the read (the polled reads' path: a hop to the pool and a
    checkout cost more than the read itself). A revocation this process commits holds
    from the next request; one made by another process (the CLI) at its notice on
    PostgreSQL, within read_cache_s on SQLite (service/read_cache.py). `few_rows` and
    `keep`: see `authenticated`."""
    users: UserDirectory = request.app.state.users

    def authenticated_read(token_hash: str) -> tuple[Principal | None, Outcome[T]]:
        user = users.authenticate_hash(token_hash)
        if user is None:
            return None, Outcome()
        try:
            return user, Outcome(value=read(user))
        except Exception as err:  # the read's own answer (a 404), given after _admit
            return user, Outcome(error=err)

    return await authenticated(
        request, credentials, authenticated_read, few_rows=few_rows, keep=keep
    )


async def authenticated(
    request: Request,
    credentials: HTTPAuthorizationCredentials | None,
    lookup: Callable[[str], tuple[Principal | None, Outcome[T]]],
    *,
    few_rows: bool = False,
    keep: Keep[T] | None = None,
) -> T:
    """What `lookup(token_hash)` read for the token's user (None: an unknown or revoked
    token, a 401), run on one pooled connection, and given after the token's rate limit.

    `few_rows`: the read is bounded to a few rows (one job, a page of a listing), so it
    skips the hop to a thread: under 32 concurrent readers the hop and the threads trading
    Python's turn cost the server more than twice the read. On SQLite it runs on the event
    loop itself (`Database.reads_inline`), on PostgreSQL it is awaited there on an
    asyncio connection (`Database.read_async`).

    `keep`: the answer is kept in the read cache, and given from there (with the token's
    user, kept likewise) while it is fresh, without a read."""
    caller = caller_of(request, credentials)
    db: Database = request.app.state.db
    # A token already over its limit is refused before any read (only a token that
    # authenticated has a bucket to be short in; this spends nothing).
    limiter: TokenBuckets = request.app.state.rate_limit
    if (wait_s := limiter.wait(caller.token_hash)) > 0:
        raise _over_rate_limit(limiter, wait_s)
    cache: ReadCache = request.app.state.read_cache
    token_key = _token_key(caller.token_hash)
    user = cache.get(token_key)
    if user is not None and keep is not None:
        kept = cache.get(keep.key(user))
        # Only an answer the user may see is given from the cache: one they may not is
        # read again, as a made-up id is, so that a 404 takes as long whether or not the
        # job exists (a quicker 404 would tell another user which ids are jobs).
        if kept is not None and keep.visible(user, kept):
            _admit(request, caller, user)
            return kept  # what `keep` put there: a T
    generation = commits()  # before the read: a commit during it drops its answer
    inline = few_rows and db.reads_inline

    def on_one_connection() -> tuple[Principal | None, Outcome[T]]:
        with db.reader(gated=not inline):
            return lookup(caller.token_hash)

    if inline:
        user, outcome = on_one_connection()
    elif few_rows and db.async_reads is not None:
        user, outcome = await db.read_async(on_one_connection)
    else:
        user, outcome = await run_in_threadpool(on_one_connection)
    admitted = _admit(request, caller, user)
    cache.put(token_key, admitted, generation)
    if outcome.error is not None:
        raise outcome.error
    if keep is not None:
        cache.put(keep.key(admitted), outcome.value, generation)
    return outcome.value  # type: ignore[return-value]  # set whenever error is not


def views_of(request: Request) -> JobViews:
    views: JobViews = request.app.state.views
    return views


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    value: T | None = None
    error: Exception | None = None


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[JobStore, Depends(get_store)]
RuntimeDep = Annotated[Runtime, Depends(get_runtime)]
CurrentUser = Annotated[Principal, Depends(get_current_user)]
AdmissionDep = Annotated[Admission, Depends(get_admission)]
RatesDep = Annotated[RatesBook, Depends(get_rates)]
CalibrationDep = Annotated[Calibration, Depends(get_calibration)]
DatabaseDep = Annotated[Database, Depends(get_database)]
TelemetryDep = Annotated[ApiTelemetry, Depends(get_telemetry)]
ExportsDep = Annotated[ExportSlots, Depends(get_exports)]
