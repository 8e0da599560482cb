"""Running a test's coroutine to completion whatever else holds the main thread's loop."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


def run_async(main: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """`asyncio.run(main())` in a thread of its own: the browser tests' session-wide
    Playwright (its sync API) keeps an event loop running in the main thread for the rest
    of the session, and `asyncio.run` refuses to start beside a running loop."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="test-loop") as pool:
        return pool.submit(lambda: asyncio.run(main())).result()
