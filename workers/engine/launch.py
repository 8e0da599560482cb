"""`shardline train`: the engine on this machine, without Ray.

N ranks are spawned as processes that join one world over TCP on localhost. Rank 0 sends
its metrics and the final summary to the parent through a queue; the parent shows
progress, writes the metrics file and returns the summary. Under torchrun (RANK and
WORLD_SIZE set) the current process is one rank and rank 0 does that reporting itself.
"""

from __future__ import annotations

import faulthandler
import logging
import multiprocessing as mp
import os
import queue
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from shardline.workers.contract.spec import JobSpec
from shardline.workers.storage.checkpoints import RestoreSource
from shardline.workers.storage.layout import CheckpointLocations

log = logging.getLogger(__name__)

# The signal a local rank answers with its threads' stacks, and how long they get.
STACKS_SIGNAL = signal.SIGUSR1
STACKS_WAIT_S = 2.0
_stacks_file: Any = None  # kept open for faulthandler in a local rank

Report = Callable[[str, Any], None]


class TrainingFailed(RuntimeError):
    """A rank raised or died; the message carries its error."""


@dataclass(frozen=True)
class LocalCheckpoints:
    """`shardline train`'s checkpoint options: save into `folder`, maybe start from it."""

    folder: str | None = None
    resume: bool = False
    stop_after_step: int | None = None  # stop (and checkpoint) after this step
    snapshot_folder: str | None = None  # in-memory snapshots, with memory_every_steps

    def locations(self) -> CheckpointLocations:
        """Where the run saves and may start from: `folder` is its checkpoints folder."""
        restore = (RestoreSource(self.folder),) if self.folder and self.resume else ()
        return CheckpointLocations(self.folder, restore, self.snapshot_folder)


class SlowRank:
    """A rank made `factor` times slower, as a slow node would be (the low-communication
    bench): after each backward it sleeps `factor - 1` times the time it worked since the
    last one (forward, backward, its optimizer step or push)."""

    def __init__(self, rank: int, factor: float) -> None:
        self.rank, self.factor = rank, factor
        self._since: float | None = None

    def __call__(self, step: int, modules: Any) -> None:
        now = time.perf_counter()
        if self._since is not None:
            time.sleep((self.factor - 1) * (now - self._since))
        self._since = time.perf_counter()


def run_rank(
    rank: int,
    world_size: int,
    master: tuple[str, int],
    spec_json: str,
    report: Report,
    local_ranks: int,
    local: LocalCheckpoints = LocalCheckpoints(),
    slow: SlowRank | None = None,
) -> None:
    """Body of one rank: join the world, train, report (rank 0), leave."""
    # Imported here so the parent and the spec stay free of torch until a rank starts.
    from shardline.workers.engine.distributed import (
        abandon_world,
        init_world,
        leave_world,
        limit_cpu_threads,
        pick_device,
    )
    from shardline.workers.engine.hooks import TrainerHooks
    from shardline.workers.engine.trainer import Trainer

    limit_cpu_threads(local_ranks)
    spec = JobSpec.model_validate_json(spec_json)
    device = pick_device(rank)
    init_world(
        rank=rank,
        world_size=world_size,
        master_addr=master[0],
        master_port=master[1],
        device=device,
        own_addr=master[0],  # every rank on this host
    )
    try:
        hooks = TrainerHooks(
            after_backward=slow if slow is not None and slow.rank == rank else None,
        )
        if rank == 0:
            hooks = replace(
                hooks,
                on_metrics=lambda m: report("metrics", m),
                on_event=lambda event: report("event", event.message),
            )
        trainer = Trainer(
            spec, world_size=world_size, device=device, hooks=hooks, checkpoints=local.locations()
        )
        summary = trainer.train(stop_after=local.stop_after_step)
    except BaseException:
        abandon_world()
        raise
    leave_world()
    if rank == 0:
        report("summary", summary)


def _spawned_rank(
    rank: int,
    world_size: int,
    port: int,
    spec_json: str,
    events: mp.Queue,
    local: LocalCheckpoints,
    environ: dict[str, str],
    slow: SlowRank | None,
    stacks: str,
) -> None:
    # Forked from the fork server, which has the environment of when it started: take the
    # caller's as it is now (data roots, cache folder, thread counts).
    os.environ.clear()
    os.environ.update(environ)
    logging.basicConfig(level=logging.WARNING, format=f"[rank {rank}] %(message)s")
    # Asked by the caller when another rank failed: where this one was (a peer stuck in
    # another collective says more than the failed rank's timeout). Written to a file of
    # the caller's: this process's stderr is the fork server's, not the caller's now.
    global _stacks_file
    _stacks_file = open(os.path.join(stacks, f"rank-{rank}.txt"), "w")  # noqa: SIM115
    faulthandler.register(STACKS_SIGNAL, file=_stacks_file, all_threads=True)
    try:
        run_rank(
            rank,
            world_size,
            ("127.0.0.1", port),
            spec_json,
            lambda kind, payload: events.put((kind, payload)),
            world_size,
            local,
            slow,
        )
    except BaseException as err:
        events.put(
            ("error", {"rank": rank, "error": repr(err), "traceback": traceback.format_exc()})
        )
        exit_rank_process(1, events)
    exit_rank_process(0, events)


def exit_rank_process(code: int, events: mp.Queue | None = None) -> None:
    """End a rank's process without interpreter teardown.

    The world has been left (or abandoned) by now, but destroying some C++ objects of
    gloo and the pipeline stages at interpreter exit can still abort the process
    ("terminate called without an active exception"), which would read as a failed rank.
    """
    if events is not None:
        events.close()
        events.join_thread()  # everything put() is in the pipe before we go
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def rank_processes() -> Any:
    """Where local ranks come from: forked from one server process that has imported
    torch and the engine already (about 3 s of CPU a process, paid once per caller, not
    once per rank of every run). Nothing there touches a GPU or starts a thread pool, so
    forking it is safe; spawn would import everything again in each rank."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["shardline.workers.engine.launch", "shardline.workers.engine.warm"])
    return ctx


def train_local(
    spec: JobSpec,
    nproc: int,
    on_metrics: Callable[[dict[str, Any]], None] | None = None,
    local: LocalCheckpoints = LocalCheckpoints(),
    on_event: Callable[[str], None] | None = None,
    slow: SlowRank | None = None,
) -> dict[str, Any]:
    """Train `spec` on `nproc` local processes; returns rank 0's summary. `slow` makes one
    of them slower (benches)."""
    from shardline.workers.contract.net import free_port

    spec.check_world_size(nproc)
    ctx = rank_processes()
    events: mp.Queue = ctx.Queue()
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="shardline-stacks-") as stacks:
        procs = [
            ctx.Process(
                target=_spawned_rank,
                args=(
                    r,
                    nproc,
                    port,
                    spec.model_dump_json(),
                    events,
                    local,
                    dict(os.environ),
                    slow,
                    stacks,
                ),
                daemon=True,
            )
            for r in range(nproc)
        ]
        for p in procs:
            p.start()
        try:
            return _collect(procs, events, on_metrics, on_event)
        except TrainingFailed as err:
            where = _stacks_of_survivors(procs, Path(stacks))
            raise TrainingFailed(f"{err}{where}") from None
        finally:
            for p in procs:
                if p.is_alive():
                    p.terminate()
                p.join(timeout=10)


def _stacks_of_survivors(procs: list[Any], stacks: Path) -> str:
    """Where the ranks still alive are, every thread's stack, as text to add to the
    failure (empty when none is alive)."""
    alive = {}
    for rank, p in enumerate(procs):
        if p.is_alive() and p.pid is not None:
            try:
                os.kill(p.pid, STACKS_SIGNAL)
            except ProcessLookupError:
                continue
            alive[rank] = stacks / f"rank-{rank}.txt"
    deadline = time.monotonic() + STACKS_WAIT_S
    while alive and time.monotonic() < deadline:
        if all(f.is_file() and f.stat().st_size for f in alive.values()):
            time.sleep(0.05)  # the last lines of the dump
            break
        time.sleep(0.05)
    parts = [
        f"\n\nrank {rank}, still running, was at:\n{f.read_text(errors='replace').strip()}"
        for rank, f in alive.items()
        if f.is_file() and f.stat().st_size
    ]
    return "".join(parts)


def _collect(
    procs: list[Any],
    events: mp.Queue,
    on_metrics: Callable[[dict[str, Any]], None] | None,
    on_event: Callable[[str], None] | None,
) -> dict[str, Any]:
    summary: dict[str, Any] | None = None
    while True:
        try:
            kind, payload = events.get(timeout=0.5)
        except queue.Empty:
            dead = [i for i, p in enumerate(procs) if p.exitcode not in (None, 0)]
            if dead:
                raise TrainingFailed(
                    f"rank {dead[0]} exited with code {procs[dead[0]].exitcode}"
                ) from None
            if summary is not None and all(p.exitcode == 0 for p in procs):
                return summary
            continue
        if kind == "metrics" and on_metrics is not None:
            on_metrics(payload)
        elif kind == "event":
            if on_event is not None:
                on_event(payload)
            else:
                log.info("%s", payload)
        elif kind == "summary":
            summary = payload
        elif kind == "error":
            raise TrainingFailed(
                f"rank {payload['rank']} failed: {payload['error']}\n{payload['traceback']}"
            )


def train_under_torchrun(
    spec: JobSpec, report: Report, local: LocalCheckpoints = LocalCheckpoints()
) -> None:
    """This process is one rank of a torchrun world."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    spec.check_world_size(world)
    master = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]))
    run_rank(
        rank,
        world,
        master,
        spec.model_dump_json(),
        report,
        int(os.environ.get("LOCAL_WORLD_SIZE", world)),
        local,
    )
