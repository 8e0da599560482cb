"""Property tests over the real server: a spec with any field replaced by any JSON value
is either stored or refused with a 4xx; a validation error names a field of the spec; and
listing keeps working whatever was stored."""

from __future__ import annotations

import json
import typing
from typing import Any

import httpx
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from shardline.workers.contract.spec import JobSpec
from tests.api.conftest import Backend


def field_paths(model: type[BaseModel], prefix: str = "") -> list[str]:
    """Every field of the spec as a dotted path, sections included."""
    paths = []
    for name, info in model.model_fields.items():
        path = f"{prefix}{name}"
        paths.append(path)
        for candidate in (info.annotation, *typing.get_args(info.annotation)):
            if isinstance(candidate, type) and issubclass(candidate, BaseModel):
                paths += field_paths(candidate, f"{path}.")
    return paths


PATHS = field_paths(JobSpec)

# Values that once got through: unstorable floats and strings, integers past 64 bits.
NASTY: list[Any] = [float("inf"), float("-inf"), float("nan"), "\ud800", "a\x00b", 2**64]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["byte", "text", "tokens", "tiny", "8b", "1f1b", "bf16", "\ud800", "a\x00b"]),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


@st.composite
def mutated_specs(draw: st.DrawFn) -> dict[str, Any]:
    spec: dict[str, Any] = {"name": "fuzz", "train": {"steps": 10}}
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS) | st.text(min_size=1, max_size=8))
        value = draw(st.sampled_from(NASTY) | json_values | st.integers(-10, 5000))
        parts = path.split(".")
        target = spec
        for part in parts[:-1]:
            if not isinstance(target.get(part), dict):
                target[part] = {}
            target = target[part]
        target[parts[-1]] = value
    return spec


def _names_a_field(field: str, spec: dict[str, Any]) -> bool:
    """A field of the JobSpec, or a key the request itself holds (an unknown field)."""
    if field in PATHS:
        return True
    node: Any = spec
    # "" names a field only where the request holds a key "" (an unknown field of that name).
    for part in field.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


@settings(
    max_examples=150,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(spec=mutated_specs())
# The values that reached the database before the spec refused them.
@example(spec={"name": "fuzz", "train": {"grad_clip": float("inf")}})
@example(spec={"name": "fuzz", "data": {"tokenizer": "\ud800"}})
@example(spec={"name": "fuzz", "data": {"tokenizer": "a\x00b"}})
def test_any_spec_is_stored_or_refused_naming_a_field(
    backend: Backend, spec: dict[str, Any]
) -> None:
    token = _token(backend)
    response = httpx.post(
        f"{backend.server.url}/v1/jobs",
        content=json.dumps(spec),  # Infinity/NaN and \ud800 escapes, as a client may send
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
    )
    assert response.status_code in (200, 201) or 400 <= response.status_code < 500, response.text
    if response.status_code == 422 and response.json()["error"]["code"] == "validation_error":
        details = response.json()["error"]["details"]
        assert details and all(_names_a_field(d["field"], spec) for d in details), response.text
    listing = httpx.get(
        f"{backend.server.url}/v1/jobs", headers={"Authorization": f"Bearer {token}"}
    )
    assert listing.status_code == 200, listing.text


_TOKENS: dict[str, str] = {}


def _token(backend: Backend) -> str:
    # One user per backend: hypothesis calls the test many times with the same fixture.
    if backend.kind not in _TOKENS:
        _TOKENS[backend.kind] = backend.new_user()[1]
    return _TOKENS[backend.kind]
