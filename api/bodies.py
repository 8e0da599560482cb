"""Request bodies -> models, with one error shape for every bad body on every route.

FastAPI's own body parsing answers a missing Content-Type with 422 and bytes that are not
UTF-8 with a 400 in another shape; routes that take a body read it with `parse_body`
instead, so each mistake has one status and the API's error body everywhere.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from shardline.api.errors import ApiError, validation_failed

M = TypeVar("M", bound=BaseModel)


def parse_body(raw: bytes, content_type: str | None, model: type[M], what: str) -> M:
    """`raw` as a `model` (`what` names it in messages), or the ApiError that says why not:
    415 not JSON, 400 not UTF-8 or not parseable, 422 the wrong shape."""
    media_type = (content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        raise ApiError(
            415,
            "unsupported_media_type",
            f"{what} is sent as Content-Type: application/json, not {media_type or 'none'}",
        )
    try:
        data: Any = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(400, "invalid_body", "the request body is not UTF-8 text") from None
    except json.JSONDecodeError as err:
        raise ApiError(400, "invalid_json", f"the request body is not JSON: {err}") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the request body is nested too deeply") from None
    if not isinstance(data, dict):
        raise ApiError(
            422, "validation_error", f"{what} is a JSON object, got {type(data).__name__}"
        )
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise validation_failed(err.errors(), model) from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the request body is nested too deeply") from None
