"""Hooks for the schemathesis command line run by tests/api/test_openapi.py.

A follow (`logs?follow=true`) streams until its job ends, and the jobs of that run never
start (no runtime): a generated follow would only run into the client's read timeout.
Follows are tested where jobs run (tests/api/test_log_follow.py, tests/e2e)."""

from __future__ import annotations

from typing import Any

import schemathesis


@schemathesis.hook
def filter_query(context: Any, query: dict[str, Any] | None) -> bool:
    return not (query and query.get("follow") in (True, "true"))
