"""The OpenAPI document is true: schemathesis sends generated requests to every operation
of the real server, with a token, and no response is a 5xx or differs from the document."""

from __future__ import annotations

import re
import time

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation.case import Case
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from tests.api.conftest import Backend

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
]
# Per operation; 14 operations, so about a thousand requests per database.
EXAMPLES = 80


def test_every_reference_resolves(backend: Backend) -> None:
    document = httpx.get(f"{backend.server.url}/openapi.json").json()
    refs = set(
        re.findall(r'"\$ref":\s*"([^"]+)"', httpx.get(f"{backend.server.url}/openapi.json").text)
    )
    assert refs and all(r.startswith("#/components/schemas/") for r in refs), refs
    schemas = document["components"]["schemas"]
    assert {r.rsplit("/", 1)[1] for r in refs} <= set(schemas)
    submit = document["paths"]["/v1/jobs"]["post"]
    assert {"400", "401", "409", "413", "415", "422"} <= set(submit["responses"])
    error = submit["responses"]["422"]["content"]["application/json"]["schema"]
    assert error == {"$ref": "#/components/schemas/ErrorBody"}


def test_generated_requests_match_the_document(backend: Backend) -> None:
    _, token = backend.new_user()
    schema = schemathesis.openapi.from_url(f"{backend.server.url}/openapi.json")
    headers = {"Authorization": f"Bearer {token}"}
    started, operations = time.monotonic(), 0
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        assert isinstance(result, Ok), result.err()  # every operation's schema is valid
        operation = result.ok()
        operations += 1

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            database=None,
            derandomize=True,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
        )
        def run(case: Case) -> None:
            response = case.call_and_validate(
                base_url=backend.server.url, headers=headers, checks=CHECKS
            )
            statuses[response.status_code] = statuses.get(response.status_code, 0) + 1

        run()
    assert operations >= 14
    assert sum(statuses.values()) >= operations * 10
    # The token worked and generated specs were accepted, not only refused.
    assert statuses.get(201, 0) > 0 and statuses.get(200, 0) > 0, statuses
    assert time.monotonic() - started < 120


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/jobs", "GET, OPTIONS, POST"),
        ("/v1/jobs/abc/faults", "OPTIONS, POST"),
        ("/v1/jobs/abc", "GET, OPTIONS"),
    ],
)
def test_options_names_every_method_of_the_path(backend: Backend, path: str, allow: str) -> None:
    response = httpx.options(f"{backend.server.url}{path}")
    assert response.status_code == 204, response.text
    assert response.headers["Allow"] == allow


def test_options_of_a_path_with_no_route_is_404(backend: Backend) -> None:
    response = httpx.options(f"{backend.server.url}/v1/nothing/here")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "not_found"
