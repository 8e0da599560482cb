"""The sequence-numbered buffer and the failure policy."""

from __future__ import annotations

import threading

from shardline.workers.contract.progress import MetricsEntry, ProgressBuffer
from shardline.workers.runtime.supervisor.decisions import FailurePolicy


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


def test_policy_backs_off_in_a_crash_loop_then_gives_up() -> None:
    policy = FailurePolicy(max_failures=3, base_backoff_s=1.0)
    first = policy.decide(1, "boom")
    # The next two come before the restarted world trained a step: a crash loop.
    second, third = (policy.decide(n, "boom", progressed=False) for n in (2, 3))
    assert (first.retry, first.backoff_s) == (True, 1.0) and "restarting in 1s)" in first.reason
    assert (second.retry, second.backoff_s) == (True, 2.0) and "crash loop" in second.reason
    assert (third.retry, third.backoff_s) == (True, 4.0)
    fourth = policy.decide(4, "boom", progressed=False)
    assert not fourth.retry and "max_failures=3" in fourth.reason


def test_a_failure_on_a_live_node_is_retried_at_once_but_a_crash_loop_still_waits() -> None:
    policy = FailurePolicy(max_failures=10, base_backoff_s=1.0)
    first = policy.decide(1, "rank 1 killed", node_suspect=False)
    assert first.backoff_s == 0.0 and "restarting at once)" in first.reason
    assert policy.decide(2, "rank 1 killed", node_suspect=False, progressed=False).backoff_s == 2.0
    assert policy.decide(3, "node lost", node_suspect=True).backoff_s == 1.0


def test_failures_after_progress_never_wait_however_many_or_close() -> None:
    """A rank killed from outside again and again, each time after the restarted job
    trained a few steps (seconds apart): no wait grows, the seventh as the first."""
    policy = FailurePolicy(max_failures=10, base_backoff_s=1.0)
    killed = [policy.decide(n, "rank 1 killed", node_suspect=False) for n in range(1, 8)]
    assert [d.backoff_s for d in killed] == [0.0] * 7
    assert not any("crash loop" in d.reason for d in killed)
    lost = [policy.decide(n, "node lost").backoff_s for n in range(8, 10)]
    assert lost == [1.0, 1.0]  # a node may be gone: a second for Ray to say so
    # Two with nothing trained between start a crash loop; a step trained ends it.
    assert policy.decide(10, "boom", progressed=False).backoff_s == 2.0


def test_policy_never_retries_an_error_of_the_job_itself() -> None:
    decision = FailurePolicy(max_failures=5).decide(1, "no such file", deterministic=True)
    assert not decision.retry and "not retried" in decision.reason
