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
    now = [0.0]
    policy = FailurePolicy(max_failures=3, base_backoff_s=1.0, clock=lambda: now[0])
    first, second, third = (policy.decide(n, "boom") for n in (1, 2, 3))
    assert (first.retry, first.backoff_s) == (True, 1.0) and "restarting in 1s)" in first.reason
    assert (second.retry, second.backoff_s) == (True, 2.0) and "crash loop" in second.reason
    assert (third.retry, third.backoff_s) == (True, 4.0)
    fourth = policy.decide(4, "boom")
    assert not fourth.retry and "max_failures=3" in fourth.reason


def test_a_failure_on_a_live_node_is_retried_at_once_but_a_crash_loop_still_waits() -> None:
    now = [0.0]
    policy = FailurePolicy(max_failures=10, base_backoff_s=1.0, clock=lambda: now[0])
    first = policy.decide(1, "rank 1 killed", node_suspect=False)
    assert first.backoff_s == 0.0 and "restarting at once)" in first.reason
    now[0] += 5.0
    assert policy.decide(2, "rank 1 killed", node_suspect=False).backoff_s == 2.0
    now[0] += 61.0
    assert policy.decide(3, "node lost", node_suspect=True).backoff_s == 1.0


def test_failures_far_apart_wait_a_second_however_many() -> None:
    now = [0.0]
    policy = FailurePolicy(max_failures=10, base_backoff_s=1.0, clock=lambda: now[0])
    waits = []
    for n in range(1, 8):
        waits.append(policy.decide(n, "node lost").backoff_s)
        now[0] += 61.0  # a minute of training between failures
    assert waits == [1.0] * 7  # the seventh no longer waits 64 s
    # Two in quick succession start a crash loop again; a healthy minute ends it.
    assert policy.decide(8, "boom").backoff_s == 1.0
    now[0] += 5.0
    assert policy.decide(9, "boom").backoff_s == 2.0
    now[0] += 60.0
    assert policy.decide(10, "boom").backoff_s == 1.0


def test_policy_never_retries_an_error_of_the_job_itself() -> None:
    decision = FailurePolicy(max_failures=5).decide(1, "no such file", deterministic=True)
    assert not decision.retry and "not retried" in decision.reason
