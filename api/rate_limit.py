"""Rate limits: a token bucket per key (an API token, or a client address for failed
authentications), in this process.

Each token may send `burst` requests at once and `rate_per_s` a second after that. The
buckets live in memory, so with several API replicas each enforces the limit on its own.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

# Buckets kept before the full (idle) ones are dropped; a full bucket holds no state.
MAX_BUCKETS = 100_000


@dataclass
class _Bucket:
    tokens: float
    stamp: float


class TokenBuckets:
    """`take(key)` spends one request of `key`'s bucket: 0.0 when allowed, else the
    seconds until the next request would be."""

    def __init__(
        self,
        rate_per_s: float,
        burst: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = MAX_BUCKETS,
    ) -> None:
        self.rate_per_s, self.burst = rate_per_s, float(burst)
        self.clock, self.max_buckets = clock, max_buckets
        self._buckets: dict[str, _Bucket] = {}
        self._lock = threading.Lock()

    @property
    def enabled(self) -> bool:
        return self.rate_per_s > 0

    def take(self, key: str) -> float:
        return self._spend(key, spend=True)

    def wait(self, key: str) -> float:
        """What take(key) would answer, spending nothing: for limits counted only on some
        outcomes (a failed authentication) but checked before every request."""
        return self._spend(key, spend=False)

    def _spend(self, key: str, *, spend: bool) -> float:
        if not self.enabled:
            return 0.0
        now = self.clock()
        with self._lock:
            bucket = self._buckets.get(key)
            if bucket is None:
                if not spend:
                    return 0.0  # a full bucket, not worth keeping
                if len(self._buckets) >= self.max_buckets:
                    self._drop_full(now)
                bucket = self._buckets[key] = _Bucket(self.burst, now)
            bucket.tokens = min(self.burst, bucket.tokens + (now - bucket.stamp) * self.rate_per_s)
            bucket.stamp = now
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0 if spend else 0.0
                return 0.0
            return (1.0 - bucket.tokens) / self.rate_per_s

    def _drop_full(self, now: float) -> None:
        full = [
            k
            for k, b in self._buckets.items()
            if b.tokens + (now - b.stamp) * self.rate_per_s >= self.burst
        ]
        for k in full:
            del self._buckets[k]


def retry_after_header(wait_s: float) -> dict[str, str]:
    """Retry-After in whole seconds (HTTP allows no fractions), at least 1."""
    return {"Retry-After": str(max(1, math.ceil(wait_s)))}
