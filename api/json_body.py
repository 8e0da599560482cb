"""Responses of the polled reads, encoded by orjson.

A job's status read spent more server CPU building a pydantic model and encoding it
(checking every stored spec for what JSON cannot carry first) than reading the row. orjson
encodes the plain values in one pass; it writes non-finite floats as null, as pydantic
does. What it refuses (a lone surrogate or an integer past 64 bits in a row stored before
the spec refused them) takes the stdlib's slower way, made safe by `json_safe`.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import orjson
from fastapi import Response

from shardline.api.schemas import json_safe, utc
from shardline.api.stored_json import StoredJson


def json_body(value: Any, status_code: int = 200) -> Response:
    """`value` (dicts, lists, strings, numbers, None, datetimes) as a JSON response;
    naive datetimes are UTC, as every stored time is."""
    return encoded_response(json_bytes(value), status_code)


def encoded_response(body: bytes, status_code: int = 200) -> Response:
    return Response(body, status_code=status_code, media_type="application/json")


def json_bytes(value: Any) -> bytes:
    """`value` encoded as `json_body` sends it."""
    try:
        return orjson.dumps(value, default=_embed, option=orjson.OPT_NAIVE_UTC)
    except orjson.JSONEncodeError:
        return json.dumps(json_safe(value), default=_plain, allow_nan=False).encode()


def _embed(value: Any) -> orjson.Fragment:
    if isinstance(value, StoredJson):
        return orjson.Fragment(value.text)
    raise TypeError(f"{type(value).__name__} is not JSON")


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return utc(value).isoformat()  # type: ignore[union-attr]
    if isinstance(value, StoredJson):
        return value.value()  # clean: StoredJson.of decoded every text that was not
    raise TypeError(f"{type(value).__name__} is not JSON")
