"""The sequence-numbered buffer and the failure policy."""

from __future__ import annotations

import threading

from workers.contract.progress import MetricsEntry, ProgressBuffer
from workers.runtime.supervisor.decisions import FailurePolicy


def test_readers_resuming_after_n_see_each_entry_once() -> None:
    buffer = ProgressBuffer()
    threads = [
        threading.Thread(
            target=lambda: [
                buffer.append(MetricsEntry(step=i, values={"step": i})) for i in range(100)
            ]
        )
        for _ in range(4)
    ]
    for t in threads:
        t.start()
    seen: list[int] = []
    last = 0
    for t in threads:
        t.join()
        batch = buffer.after(last)
        seen += [e.seq for e in batch]
        last = batch[-1].seq if batch else last
    seen += [e.seq for e in buffer.after(last)]
    assert seen == list(range(1, 401))


def test_policy_retries_with_growing_backoff_then_gives_up() -> None:
    policy = FailurePolicy(max_failures=2, base_backoff_s=1.0)
    first, second, third = (policy.decide(n, "boom") for n in (1, 2, 3))
    assert (first.retry, first.backoff_s) == (True, 1.0)
    assert (second.retry, second.backoff_s) == (True, 2.0)
    assert not third.retry and "max_failures=2" in third.reason


def test_policy_never_retries_an_error_of_the_job_itself() -> None:
    decision = FailurePolicy(max_failures=5).decide(1, "no such file", deterministic=True)
    assert not decision.retry and "not retried" in decision.reason
