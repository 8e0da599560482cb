"""Deciding whether a failed job is retried: decisions apart from mechanics."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Decision:
    retry: bool
    reason: str
    backoff_s: float = 0.0


class FailurePolicy:
    """Retry up to `max_failures` times, waiting longer after each failure."""

    def __init__(
        self, max_failures: int, base_backoff_s: float = 1.0, max_backoff_s: float = 60.0
    ) -> None:
        self.max_failures = max_failures
        self.base_backoff_s = base_backoff_s
        self.max_backoff_s = max_backoff_s

    def decide(self, failures_so_far: int, error: str, *, deterministic: bool = False) -> Decision:
        """`failures_so_far` counts this failure too. A deterministic failure (the job's own
        spec or data cannot work) would fail the same way again: no retry."""
        if deterministic:
            return Decision(False, f"{error} (an error of the job itself: not retried)")
        if failures_so_far > self.max_failures:
            return Decision(
                False,
                f"{error} (failure {failures_so_far}, more than "
                f"fault_tolerance.max_failures={self.max_failures})",
            )
        backoff = min(self.base_backoff_s * 2 ** (failures_so_far - 1), self.max_backoff_s)
        return Decision(
            True,
            f"{error} (failure {failures_so_far} of at most "
            f"{self.max_failures}; restarting in {backoff:.0f}s)",
            backoff,
        )
