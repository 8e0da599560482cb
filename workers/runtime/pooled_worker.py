"""A rank's process started before there is a job for it: the warm pool's worker.

It starts at the lowest CPU priority and imports torch and the engine (about 1.5 s of a
CPU rank's start) in a thread, so it can be adopted while it imports. `adopt()` raises it
to normal priority, waits for the imports, and makes it one rank of a job, exactly as a
`TrainingWorker` started for that rank would be; from then on it is one: the worker group
calls the same methods on it and kills it the same way. A job that comes while the pool's
replacements still import (jobs back to back) takes them, and what is left of their
imports runs at the job's priority: before, it started fresh processes beside them.

The pool owns its processes (Ray ends them with it), so a job's supervisor does not: a
rank the supervisor started would die with the supervisor, and an adopted one must too, or
it would train on beside the next supervisor's ranks. So an adopted worker watches the
supervisor that adopted it and ends its process once Ray says that actor died.

A rank whose job ended cleanly (it finished or was stopped, left its world, and saves
nothing) goes back to the pool (`recycle()`): the next job adopts a process that imported
everything long ago, instead of one that may still be importing. It keeps nothing of the
job: its rank's state is built again by the next `adopt()`, the job's log file is let go,
and the model, optimizer and process group are gone. A rank that failed, or is still in
a world, is never recycled: the worker group kills it as before.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
import threading
from typing import Any

from shardline.workers.contract.data_access import DataAccess
from shardline.workers.contract.spec import JobSpec
from shardline.workers.contract.status import WorkerPhase
from shardline.workers.runtime import priority
from shardline.workers.runtime.rank_process import empty_device_cache
from shardline.workers.runtime.warm_pool import Recycled, resident_bytes
from shardline.workers.runtime.worker import TrainingWorker
from shardline.workers.storage.layout import CheckpointLocations, JobLayout

log = logging.getLogger(__name__)

# How often an adopted worker asks whether its supervisor is alive, and how long it
# waits for an answer (a busy supervisor answers late; only a death ends the rank).
WATCH_EVERY_S = 2.0
WATCH_TIMEOUT_S = 30.0


class PooledWorker(TrainingWorker):
    def __init__(self) -> None:  # no job yet: TrainingWorker.__init__ runs in adopt()
        self._background = priority.lower()  # the import thread starts at this priority
        self._adopted = False
        self._jobs = 0  # the jobs this process has been a rank of
        self._watching: threading.Event | None = None  # set: stop watching the supervisor
        self._imports = threading.Thread(target=_import_engine, name="imports", daemon=True)
        self._imports.start()

    def imported(self) -> bool:
        """Whether torch and the engine are imported (the pool's count of ready ones)."""
        return not self._imports.is_alive()

    def adopt(
        self,
        layout: JobLayout,
        rank: int,
        world_size: int,
        spec: JobSpec,
        checkpoints: CheckpointLocations | None,
        cpus: float,
        supervisor: Any | None,
        access: DataAccess | None = None,
    ) -> int:
        """Become `rank` of the job (at normal priority), reading data by `access`, the
        rules of the supervisor that adopts it (a fresh rank inherits them from its
        environment; this process was started by the pool, whose environment is that of
        whichever control plane created it); returns this process's id."""
        if self._adopted:
            raise RuntimeError("this pooled worker already holds a rank")
        priority.normal()  # every thread, the imports too, if they still run
        self._imports.join()
        if access is not None:
            access.install()
        TrainingWorker.__init__(self, layout, rank, world_size, spec, checkpoints, cpus)
        self._adopted = True
        self._jobs += 1
        if supervisor is not None:
            self._watching = threading.Event()
            threading.Thread(
                target=self._watch,
                args=(supervisor, self._watching),
                name="watch-supervisor",
                daemon=True,
            ).start()
        log.info("job %s: a pooled worker became rank %d", layout.job_id, rank)
        return os.getpid()

    def recycle(self) -> Recycled | None:
        """Stop being the job's rank and be an idle pooled worker again, if this rank may
        be reused: its training ended cleanly (or never started), it left its world, and
        no save of it is in flight. What the pool needs to judge the process (it may still
        stop it: workers/runtime/warm_pool.py); None where it was not, and nothing changed."""
        import torch.distributed as dist

        if not self._adopted:
            return None
        if self._thread is not None and self._thread.is_alive():
            return None  # still training, or still leaving its world
        clean = self._phase in (WorkerPhase.IDLE, WorkerPhase.DONE, WorkerPhase.STOPPED)
        saving = self._trainer is not None and self._trainer.checkpoints.in_flight()
        if not clean or self._error is not None or saving or self._saves or dist.is_initialized():
            return None
        if self._watching is not None:
            self._watching.set()  # the supervisor ends with the job: no death of ours
            self._watching = None
        log.info("job %s: rank %d goes back to the warm pool", self.job_id, self.rank)
        logging.getLogger().removeHandler(self._log_handler)  # the job's own log file
        self._log_handler.close()
        self._trainer = None
        self._thread = None
        self._adopted = False
        if "torch._dynamo" in sys.modules:  # compiled blocks: the next job compiles its own
            sys.modules["torch._dynamo"].reset()
        gc.collect()  # the model's modules and hooks hold one another in cycles
        empty_device_cache()
        return Recycled(self._jobs, resident_bytes())

    def _watch(self, supervisor: Any, recycled: threading.Event) -> None:
        import ray

        while not recycled.wait(WATCH_EVERY_S):
            try:
                ray.get(supervisor.__ray_ready__.remote(), timeout=WATCH_TIMEOUT_S)
            except ray.exceptions.ActorDiedError:
                if recycled.is_set():  # its job ended cleanly meanwhile
                    return
                log.error(
                    "job %s: the supervisor that adopted rank %d is gone; the rank ends, "
                    "as a rank it started would",
                    self.job_id,
                    self.rank,
                )
                os._exit(1)
            except Exception:  # slow, or unreachable for a moment: not a death
                continue


def _import_engine() -> None:
    """What a rank's start spends its time on, done ahead."""
    import torch  # noqa: F401

    import shardline.workers.engine.warm  # noqa: F401
