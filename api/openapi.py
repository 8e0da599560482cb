"""The OpenAPI document: the JobSpec's schema in components, and every error documented
with the shape it really has."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from api.schemas import ErrorBody
from workers.contract.spec import JobSpec

_WHY = {
    400: "The body is not UTF-8 JSON, or is nested too deeply",
    401: "Missing, invalid or revoked bearer token",
    403: "Only administrators may do this",
    404: "No such job, or another user's job",
    409: "Conflicts with the job's state, or an Idempotency-Key used for another spec",
    413: "The request body is larger than the server allows",
    415: "The body is not sent as application/json",
    422: "A field is invalid (details name each field), or the job cannot fit the cluster",
    429: "Too many requests with this token, or too many queued jobs (submit); see Retry-After",
    503: "The database does not answer; see Retry-After",
}

# Statuses whose answer says when to try again.
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 1},
    }
}

# Where the JobSpec's schema lives; POST /v1/jobs refers to it.
JOB_SPEC_REF = "#/components/schemas/JobSpec"


def error_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """`responses=` entries for these statuses, each with the error shape."""
    return {
        status: {
            "model": ErrorBody,
            "description": _WHY[status],
            **({"headers": _RETRY_AFTER} if status in (429, 503) else {}),
        }
        for status in statuses
    }


def install_openapi(app: FastAPI) -> None:
    """Build the document once, adding the JobSpec (read by the route from raw bytes, so
    FastAPI does not see it) and its sections to components."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            spec = JobSpec.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(spec.pop("$defs", {}))
            schemas["JobSpec"] = spec
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]
