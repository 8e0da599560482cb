"""When a local rank fails, the ranks still alive say where they were before they are
stopped: a peer waiting in a collective is what explains a hang."""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

import psutil
import pytest

from shardline.workers.engine.launch import SlowRank, TrainingFailed, train_local
from tests.dist.runs import tiny_spec


def rank_pids() -> list[int]:
    """The processes the fork server made for this run (its children)."""
    servers = [
        c
        for c in psutil.Process().children(recursive=True)
        if "forkserver" in " ".join(c.cmdline())
    ]
    return sorted(r.pid for s in servers for r in s.children())


def test_a_failed_run_shows_where_the_other_ranks_were() -> None:
    """Rank 1 is held up (thousands of times slower) when rank 0 is killed: its stack,
    down to where it waits, is written before it is stopped."""
    spec = tiny_spec(parallel={"dp": 2}, train={"steps": 10_000})
    killed: list[int] = []

    def kill_rank_0_soon(_: dict[str, Any]) -> None:
        # After step 1, rank 1 sleeps in its slow hook after step 2's backward (for
        # minutes) and rank 0 waits for it: kill rank 0 once that is surely so.
        if not killed:
            pids = rank_pids()  # started in rank order
            assert len(pids) == 2, pids
            killed.append(pids[0])
            threading.Timer(3.0, os.kill, (pids[0], signal.SIGKILL)).start()

    with pytest.raises(TrainingFailed, match="rank 0 exited with code -9") as failed:
        train_local(spec, 2, on_metrics=kill_rank_0_soon, slow=SlowRank(1, 5000))
    said = str(failed.value)
    assert "rank 1, still running, was at:" in said, said
    assert "in __call__" in said and "in run_rank" in said  # held in the slow hook
