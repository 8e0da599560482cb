"""The OpenAPI document: the JobSpec's schema in components, and every error documented
with the shape it really has."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel

from shardline.api.schemas import ErrorBody, FaultCreate, JobPatch, ProfileCreate
from shardline.workers.contract.spec import JobSpec

_WHY = {
    400: "The body is not UTF-8 JSON, or is nested too deeply",
    401: "Missing, invalid or revoked bearer token",
    403: "Only administrators may do this",
    404: "No such job, or another user's job",
    409: "Conflicts with the job's state, or an Idempotency-Key used for another spec",
    413: "The request body is larger than the server allows",
    415: "The body is not sent as application/json",
    422: "A field is invalid (details name each field), or the job cannot fit the cluster",
    429: (
        "Too many requests (with this token, or with bad tokens from this address), "
        "queued jobs (submit) or exports; see Retry-After"
    ),
    503: "The database does not answer; see Retry-After",
}

# Statuses whose answer says when to try again.
_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before trying again",
        "schema": {"type": "integer", "minimum": 1},
    }
}

# Bodies the routes read from raw bytes (api/bodies.py), so FastAPI does not see them:
# their schemas are added to components here, and each route names its own.
BODY_MODELS: tuple[type[BaseModel], ...] = (JobSpec, FaultCreate, JobPatch, ProfileCreate)


def request_body(model: type[BaseModel]) -> dict[str, Any]:
    """The `openapi_extra` of a route that reads a `model` as its JSON body."""
    ref = f"#/components/schemas/{model.__name__}"
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": {"$ref": ref}}},
        }
    }


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
    """Build the document once, adding BODY_MODELS (read by their routes from raw bytes,
    so FastAPI does not see them) and their sections to components."""

    def build() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(
                title=app.title,
                version=app.version,
                description=app.description,
                routes=app.routes,
            )
            schemas = document.setdefault("components", {}).setdefault("schemas", {})
            for model in BODY_MODELS:
                schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
                schemas.update(schema.pop("$defs", {}))
                schemas[model.__name__] = schema
            app.openapi_schema = document
        return app.openapi_schema

    app.openapi = build  # type: ignore[method-assign]
