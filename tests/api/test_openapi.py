"""The OpenAPI document is true: schemathesis sends generated requests to every operation
of the real server, with a token, and no response is a 5xx or differs from the document."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

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
# The stateful phase's budget per database: sequences that follow the links schemathesis
# infers (a submitted job's id into its GET, cancel, pause, resume, events, logs, faults,
# export), a few hundred scenarios in this time.
STATEFUL_S = 20
SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")


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


def test_stateful_sequences_pass_every_check(backend: Backend) -> None:
    """schemathesis's own command line, as an outside prober would run it: every check,
    stateful phase. All but `positive_data_acceptance`, which takes any 422 to a
    schema-valid request for a failure: the document cannot say that a cursor must be one
    the API returned, or a rank one the job has (the server says so, naming the field)."""
    _, token = backend.new_user()
    run = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{backend.server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {token}",
            "--checks",
            "all",
            "--exclude-checks",
            "positive_data_acceptance",
            "--phases",
            "stateful",
            "--max-time",
            str(STATEFUL_S),
            "--seed",
            "3",
            "--workers",
            "1",
            "--request-timeout",
            "10",
            "--no-color",
        ],
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks",
            "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
        },
        capture_output=True,
        text=True,
        timeout=STATEFUL_S * 8,
    )
    report = run.stdout + run.stderr
    assert run.returncode == 0, report[-6000:]
    assert "No issues found" in report, report[-3000:]
    # The links were followed, not only the roots called.
    covered = re.search(r"API Links:\s+(\d+) covered", report)
    assert covered and int(covered.group(1)) >= 20, report[-3000:]


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/jobs", "GET, OPTIONS, POST"),
        ("/v1/jobs/abc/faults", "OPTIONS, POST"),
        ("/v1/jobs/abc", "DELETE, GET, OPTIONS, PATCH"),
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
