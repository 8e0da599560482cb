"""ConcurrencyGate: a bounded number of threads inside the database, re-entrant, and a
wait that ends as the pool's own timeout."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import exc as sa_exc

from shardline.service.db import ConcurrencyGate


def test_no_more_than_the_limit_are_inside_at_once() -> None:
    gate = ConcurrencyGate(3, timeout_s=30)
    inside, most, lock = 0, 0, threading.Lock()

    def call(_: int) -> None:
        nonlocal inside, most
        with gate.held():
            with lock:
                inside += 1
                most = max(most, inside)
            time.sleep(0.02)
            with lock:
                inside -= 1

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(call, range(64)))
    assert most == 3


def test_a_thread_inside_may_enter_again_without_waiting_on_itself() -> None:
    gate = ConcurrencyGate(1, timeout_s=0.5)
    with gate.held(), gate.held(), gate.held():
        pass
    with gate.held():  # every level let go: the slot is free again
        pass


def test_waiting_too_long_is_the_pools_timeout_error() -> None:
    gate = ConcurrencyGate(1, timeout_s=0.2)
    entered, leave = threading.Event(), threading.Event()

    def hold() -> None:
        with gate.held():
            entered.set()
            leave.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    try:
        assert entered.wait(10)
        with pytest.raises(sa_exc.TimeoutError, match="still running"), gate.held():
            pass
    finally:
        leave.set()
        holder.join()
