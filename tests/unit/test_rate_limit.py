"""The per-token bucket: bursts, sustained rate, Retry-After and idle buckets dropped."""

from __future__ import annotations

from shardline.api.rate_limit import TokenBuckets, retry_after_header
from tests.support.clock import Clock


def test_a_burst_passes_then_the_rate_holds() -> None:
    clock = Clock()
    buckets = TokenBuckets(2.0, 5, clock=clock)
    assert [buckets.take("t") for _ in range(5)] == [0.0] * 5
    assert buckets.take("t") == 0.5  # one request every 0.5 s at 2 per second
    clock.now += 0.5
    assert buckets.take("t") == 0.0
    assert buckets.take("t") > 0


def test_tokens_are_limited_separately() -> None:
    buckets = TokenBuckets(1.0, 1, clock=Clock())
    assert buckets.take("a") == 0.0
    assert buckets.take("a") > 0
    assert buckets.take("b") == 0.0


def test_zero_rate_turns_the_limit_off() -> None:
    buckets = TokenBuckets(0.0, 1, clock=Clock())
    assert all(buckets.take("t") == 0.0 for _ in range(100))


def test_full_buckets_are_dropped_when_there_are_too_many() -> None:
    clock = Clock()
    buckets = TokenBuckets(10.0, 2, clock=clock, max_buckets=3)
    for key in "abc":
        buckets.take(key)
    clock.now += 1.0  # every bucket has refilled
    buckets.take("d")
    assert set(buckets._buckets) == {"d"}


def test_retry_after_is_whole_seconds_at_least_one() -> None:
    assert retry_after_header(0.01) == {"Retry-After": "1"}
    assert retry_after_header(2.2) == {"Retry-After": "3"}
