"""Run a test's function on every rank of a local gloo world, to look inside a step.

`train_local` reports only metrics; tests that must see what happens during a step (dtypes,
which parameters are whole) run their own function on each rank and get back what it
returns. The function must live at module level so the rank processes can import it.
"""

from __future__ import annotations

import multiprocessing as mp
import pickle
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch

from shardline.workers.contract.net import free_port
from shardline.workers.engine.distributed import init_world, leave_world, limit_cpu_threads
from shardline.workers.engine.launch import exit_rank_process, rank_processes

RankFn = Callable[[int, int, torch.device], Any]


def _rank(fn: RankFn, rank: int, world_size: int, port: int, results: mp.Queue) -> None:
    limit_cpu_threads(world_size)
    device = torch.device("cpu")
    try:
        init_world(
            rank=rank,
            world_size=world_size,
            master_addr="127.0.0.1",
            master_port=port,
            device=device,
        )
        # Plain pickle bytes, not the queue's own pickler: that one sends a tensor's storage
        # as a file descriptor which this process must still serve when the parent reads
        # it, and the rank exits at once ("Connection reset by peer" in the parent).
        results.put((rank, "ok", pickle.dumps(fn(rank, world_size, device))))
        leave_world()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        exit_rank_process(1, results)
    exit_rank_process(0, results)


def on_ranks(
    fn: RankFn, world_size: int, timeout_s: float = 300.0, dying: frozenset[int] = frozenset()
) -> list[Any]:
    """`fn(rank, world_size, device)` on each rank; the results in rank order (None for
    the `dying` ranks, which exit without one)."""
    ctx = rank_processes()  # forked from the engine's fork server, as train_local's ranks
    results: mp.Queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_rank, args=(fn, r, world_size, port, results), daemon=True)
        for r in range(world_size)
    ]
    for p in procs:
        p.start()
    try:
        got: dict[int, Any] = {}
        while len(got) < world_size - len(dying):
            try:
                rank, kind, value = results.get(timeout=timeout_s)
            except queue.Empty:
                raise AssertionError(
                    f"ranks {sorted(set(range(world_size)) - set(got))} "
                    f"sent nothing in {timeout_s:.0f}s"
                ) from None
            if kind == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            got[rank] = pickle.loads(value)
        return [got.get(r) for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
                p.join()
