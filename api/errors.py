"""One error shape for every failure: {"error": {"code", "message", "details"}}."""

from __future__ import annotations

import logging
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import exc as db_errors
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from shardline.api.rate_limit import retry_after_header
from shardline.service.admission import Refused, SpecInvalid, StorageUnavailable
from shardline.service.outages import OutageLog, database_unavailable, first_line
from shardline.service.profiles import ProfileNotFound
from shardline.service.queue import PriorityRefused
from shardline.service.quotas import QuotaExceeded
from shardline.service.store import (
    ConcurrentUpdate,
    IdempotencyConflict,
    IllegalTransition,
    JobNotFound,
    StoreError,
)
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.spec_errors import explain

log = logging.getLogger(__name__)

_STORE_STATUS: dict[type[StoreError], int] = {
    JobNotFound: 404,
    IdempotencyConflict: 409,
    IllegalTransition: 409,
    ConcurrentUpdate: 409,
    PriorityRefused: 403,
    ProfileNotFound: 404,
}
_HTTP_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "payload_too_large",
    415: "unsupported_media_type",
    422: "validation_error",
    429: "too_many_requests",
    503: "unavailable",
}


class ApiError(Exception):
    """Raised by routes; rendered with the error shape."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Any = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.details = status, code, message, details
        self.headers = headers


def error_body(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "details": details}}


def error_response(
    status: int, code: str, message: str, details: Any = None, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse(error_body(code, message, details), status_code=status, headers=headers)


# A dotted field path as cross-field messages write it: "train.global_batch_size=...".
_NAMED_FIELD = re.compile(r"\b([a-z_]+(?:\.[a-z_]+)+)\b")


def field_errors(errors: Any, root: type[BaseModel] | None = None) -> list[dict[str, str]]:
    """Pydantic errors as [{field, message}], the field a dotted path into the body (of
    `root`'s shape where given: an unknown key then names its nearest field).

    A cross-field rule fails on the section holding its fields (or on the whole spec), so
    its field is the first one its message names below that section."""
    out = []
    for e in errors:
        parts = [p for p in e.get("loc", ()) if p != "body"]
        loc = ".".join(str(p) for p in parts)
        message = explain(dict(e), parts, root)
        if e.get("type") == "value_error":
            named = [m for m in _NAMED_FIELD.findall(message) if m.startswith(loc)]
            loc = named[0] if named else loc
        out.append({"field": loc, "message": message})
    return out


def validation_failed(errors: Any, root: type[BaseModel] | None = None) -> ApiError:
    """A 422 whose message is the first field error and whose details list them all."""
    details = field_errors(errors, root)
    first = details[0] if details else {"field": "", "message": "invalid request"}
    message = f"{first['field']}: {first['message']}" if first["field"] else first["message"]
    return ApiError(422, "validation_error", message, details)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err.status, err.code, err.message, err.details, err.headers)

    @app.exception_handler(StoreError)
    async def _store_error(_: Request, err: StoreError) -> JSONResponse:
        return error_response(_STORE_STATUS.get(type(err), 409), err.code, str(err))

    @app.exception_handler(Refused)
    async def _refused(_: Request, err: Refused) -> JSONResponse:
        return error_response(err.status, err.code, err.message, err.details)

    @app.exception_handler(SpecInvalid)
    async def _spec_invalid(_: Request, err: SpecInvalid) -> JSONResponse:
        # The shape read from a config.json does not fit the layout (heads by tp, ...).
        failed = validation_failed(err.errors, JobSpec)
        return error_response(failed.status, failed.code, failed.message, failed.details)

    @app.exception_handler(StorageUnavailable)
    async def _storage(_: Request, err: StorageUnavailable) -> JSONResponse:
        # A 503 that says so, not a 500.
        return error_response(503, "unavailable", str(err))

    @app.exception_handler(QuotaExceeded)
    async def _quota(_: Request, err: QuotaExceeded) -> JSONResponse:
        return error_response(
            429, err.code, str(err), headers=retry_after_header(err.retry_after_s)
        )

    for database_error in (db_errors.DBAPIError, db_errors.TimeoutError):
        app.add_exception_handler(database_error, _database_error)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, err: RequestValidationError) -> JSONResponse:
        failed = validation_failed(err.errors())
        return error_response(failed.status, failed.code, failed.message, failed.details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, err: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(err.status_code, "http_error")
        return error_response(
            err.status_code, code, str(err.detail), headers=getattr(err, "headers", None)
        )

    # Not an exception_handler(Exception): Starlette runs that one in its outermost
    # middleware, which re-raises after answering, so the server logged each error twice.
    app.add_middleware(CatchUnexpected)


DATABASE_RETRY_AFTER_S = 5
# Every request answered 503 while the database is down is one failure of one outage.
_database_outage = OutageLog(log, "the database does not answer; requests get 503")


async def _database_error(request: Request, err: Exception) -> JSONResponse:
    if not database_unavailable(err):
        raise err  # CatchUnexpected logs it once and answers 500
    _database_outage.failed(f"{first_line(err)} (on {request.method} {request.url.path})")
    return error_response(
        503,
        "unavailable",
        "the database does not answer; retry after the Retry-After seconds (a submit with "
        "the same Idempotency-Key never makes a second job)",
        headers=retry_after_header(DATABASE_RETRY_AFTER_S),
    )


class CatchUnexpected:
    """ASGI middleware: an exception no handler took is logged once and answered with
    the 500 error shape (when no response has started yet)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if not started:
                response = error_response(
                    500,
                    "internal_error",
                    "the server failed to handle this request; it has been logged",
                )
                await response(scope, receive, send)
