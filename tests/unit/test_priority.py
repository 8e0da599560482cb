"""CPU priority: a warm spare's thread goes to the lowest priority (and the threads it
starts with it), and every thread comes back to normal; run in a process of its own, so
this test process keeps its priority."""

from __future__ import annotations

import subprocess
import sys

import pytest

from shardline.workers.runtime import priority

CHILD = """
import os, threading
from shardline.workers.runtime import priority
os.setpriority(os.PRIO_PROCESS, 0, 15)  # as Ray starts its workers
assert priority.lower() and priority.thread_nice() == 19
seen = []
worker = threading.Thread(target=lambda: seen.append(priority.thread_nice()))
worker.start(); worker.join()
assert seen == [19], seen  # a thread started after inherits it
stay = threading.Event()
idle = threading.Thread(target=stay.wait)
idle.start()
priority.raise_back()
nices = {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir("/proc/self/task")}
stay.set(); idle.join()
assert nices == {0}, nices
os.setpriority(os.PRIO_PROCESS, 0, 15)
assert priority.normal() and priority.thread_nice() == 0
print("ok")
"""


@pytest.mark.skipif(not priority.can_raise_back(), reason="needs CAP_SYS_NICE or RLIMIT_NICE")
def test_a_spare_runs_lowest_and_comes_back_to_normal() -> None:
    done = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr
