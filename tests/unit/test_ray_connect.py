"""RayRuntime's connection to a cluster at ray_address: tried again, within a bound.

ray.init is replaced here: the failure this covers (a Ray Client's per-client server that
exits while the head is loaded) cannot be caused on purpose on a real head.
"""

from __future__ import annotations

import pytest

import shardline.service.ray_runtime as ray_runtime
from shardline.service.config import Settings
from shardline.service.ray_runtime import RayRuntime


class FlakyInit:
    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0
        self.shutdowns = 0

    def init(self, **_: object) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionAbortedError("Starting Ray client server failed.")

    def shutdown(self) -> None:
        self.shutdowns += 1


def runtime(monkeypatch: pytest.MonkeyPatch, flaky: FlakyInit, timeout_s: float) -> RayRuntime:
    monkeypatch.setattr(ray_runtime.ray, "init", flaky.init)
    monkeypatch.setattr(ray_runtime.ray, "shutdown", flaky.shutdown)
    monkeypatch.setattr(ray_runtime.time, "sleep", lambda s: None)
    rt = RayRuntime.__new__(RayRuntime)
    rt.settings = Settings(ray_connect_timeout_s=timeout_s)
    rt.address = "ray://head:10001"
    return rt


def test_a_failed_first_connection_is_tried_again(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = FlakyInit(failures=2)
    runtime(monkeypatch, flaky, timeout_s=60)._connect()
    assert flaky.calls == 3
    assert flaky.shutdowns == 2  # each half-made client context is cleared before the next


def test_it_gives_up_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    flaky = FlakyInit(failures=100)
    with pytest.raises(ConnectionAbortedError):
        runtime(monkeypatch, flaky, timeout_s=0)._connect()
    assert flaky.calls == 1
